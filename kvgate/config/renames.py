"""Keys that moved to another section, still read at their old place for one release, and keys
that no longer mean anything, still accepted (with a warning) for one release.

The auth settings moved to the ``auth`` section (``kvgate.config.auth`` says why). A config that
still gives one at its old place loads as if it gave it at the new one, and the loader warns once
per old key, naming both, so an operator renames at leisure within the release. A config giving
both with different values is refused, naming both: taking either would silently drop the other.
The next release drops this module, and the old keys become unknown keys.

This runs on the raw document, after the environment overrides, so an old variable
(``KVGATE_SERVER__ADMIN_TOKEN``) moves with its key.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

MOVED: tuple[tuple[str, str], ...] = (
    ("server.admin_token", "auth.admin_token"),
    ("server.admin_token_file", "auth.admin_token_file"),
    ("server.observability_token", "auth.observability_token"),
    ("server.observability_token_file", "auth.observability_token_file"),
    ("server.protect_observability", "auth.protect_observability"),
    ("server.forward_client_credentials", "auth.forward_client_credentials"),
    ("admission.auth_enabled", "auth.enabled"),
)
"""Old key, new key: each a section and a key of it."""

RETIRED: tuple[tuple[str, str], ...] = (
    ("routing.scorer_weights", "the kvgate policy places by prefill work, not by weighted scores"),
    ("routing.bounded_load_factor", "a replica's cache keeps a request within routing.ttft_tolerance_s"),
    ("routing.holder_load_factor", "a replica's cache keeps a request within routing.ttft_tolerance_s"),
    ("routing.prefix_home_key_tokens", "a prefix every replica holds no longer decides placement"),
    ("routing.prefix_home_full_tokens", "a cached prefix counts for the prefill tokens it saves"),
    ("routing.scan_prompt_tokens", "a long prompt goes where the prefill work left is least"),
)
"""Key, and why it is gone: dropped with a warning, so an old config still starts."""

TENANT_KEYS: tuple[str, ...] = ("api_keys", "api_keys_file")
"""Keys of an ``admission.tenants`` entry that moved to the ``auth.tenants`` entry of its name."""


@dataclass(frozen=True, slots=True)
class Clash:
    """A key given at its old and its new place, with different values (not shown: secrets)."""

    old: str
    new: str

    @property
    def message(self) -> str:
        return f"also given as {self.new}, with another value: give it once, as {self.new}"


@dataclass(frozen=True, slots=True)
class Renamed:
    """What moving the old keys found: one warning per old key given, and every clash."""

    warnings: list[str]
    clashes: list[Clash]


def variable(key: str) -> str:
    """The environment variable that sets ``key`` (``auth.admin_token`` -> ``KVGATE_AUTH__ADMIN_TOKEN``)."""
    return "KVGATE_" + "__".join(part.upper() for part in key.split("."))


def move_old_keys(document: dict[str, Any]) -> Renamed:
    """Move every old key of ``document`` (changed in place: the loader's own copy) to its new place."""
    found = Renamed([], [])
    for old, new in MOVED:
        if _move(document, old, new, found.clashes):
            found.warnings.append(
                f"{old} is read for one more release: move it to {new} "
                f"(in the environment {variable(old)} becomes {variable(new)})"
            )
    for key, why in RETIRED:
        section_name, name = key.split(".")
        section = document.get(section_name)
        if isinstance(section, dict) and name in section:
            del section[name]
            found.warnings.append(f"{key} is no longer used ({why}): remove it")
    moved_by_key = _move_tenant_keys(document, found.clashes)
    for key, tenants in moved_by_key.items():
        found.warnings.append(
            f"admission.tenants[].{key} is read for one more release: move it to auth.tenants[].{key}, "
            f"in an auth.tenants entry of the tenant's name ({', '.join(tenants)})"
        )
    return found


def _move(document: dict[str, Any], old: str, new: str, clashes: list[Clash]) -> bool:
    old_section, old_key = old.split(".")
    new_section, new_key = new.split(".")
    source = document.get(old_section)
    if not isinstance(source, dict) or old_key not in source:
        return False
    target = _section(document, new_section)
    if target is None:
        return False
    value = source.pop(old_key)
    if new_key in target and not _same(target[new_key], value):
        clashes.append(Clash(old, new))
    else:
        target[new_key] = value
    return True


def _move_tenant_keys(document: dict[str, Any], clashes: list[Clash]) -> dict[str, list[str]]:
    """Move each ``admission.tenants`` entry's keys to the ``auth.tenants`` entry of its name;
    the tenants moved, by key. An entry without a name stays as it is, for validation to report."""
    admission = document.get("admission")
    tenants = admission.get("tenants") if isinstance(admission, dict) else None
    if not isinstance(tenants, list):
        return {}
    moving = [
        t
        for t in tenants
        if isinstance(t, dict) and isinstance(t.get("name"), str) and set(t) & set(TENANT_KEYS)
    ]
    auth = _section(document, "auth") if moving else None
    if auth is None:
        return {}
    entries = auth.setdefault("tenants", [])
    if not isinstance(entries, list):
        return {}
    by_name = {e["name"]: e for e in entries if isinstance(e, dict) and isinstance(e.get("name"), str)}
    moved: dict[str, list[str]] = {}
    for tenant in moving:
        name = tenant["name"]
        entry = by_name.setdefault(name, {"name": name})
        if entry not in entries:
            entries.append(entry)
        for key in TENANT_KEYS:
            if key not in tenant:
                continue
            value = tenant.pop(key)
            moved.setdefault(key, []).append(name)
            if key in entry and not _same(entry[key], value):
                clashes.append(Clash(f"admission.tenants.{name}.{key}", f"auth.tenants.{name}.{key}"))
            else:
                entry[key] = value
    return moved


def _section(document: dict[str, Any], name: str) -> dict[str, Any] | None:
    """``document[name]``, made a mapping when absent or empty; None when it is something else."""
    if document.get(name) is None:
        document[name] = {}
    section = document[name]
    return section if isinstance(section, dict) else None


def _same(a: Any, b: Any) -> bool:
    """Equal as the config reads them: a token given as digits in one place and as text in the
    other is one token."""
    if isinstance(a, list | tuple) and isinstance(b, list | tuple):
        return len(a) == len(b) and all(_same(x, y) for x, y in zip(a, b, strict=True))
    return a == b or (isinstance(a, int | str) and isinstance(b, int | str) and str(a) == str(b))
