"""Load a config: YAML file, then ``KVGATE_*`` environment overrides, then validation.

Overrides name a path into the document with double underscores: ``KVGATE_SERVER__PORT=9000`` sets
``server.port``, ``KVGATE_POOLS__0__KV_CAPACITY_TOKENS=200000`` sets a field of the first pool.
Each value is parsed as YAML, so ``KVGATE_POOLS__0__REPLICAS='[http://a:8000]'`` gives a list.
Variables without a double underscore (``KVGATE_REQUIRE_REDIS``) are not overrides. Validation
reports every bad key at once, each with its value and the unit its name implies (one line when
there is one problem: a file that cannot be read, or YAML that does not parse, with its line and
column), except secrets: the value of a secret field (every ``SecretStr`` of the schema), anywhere
inside a reported value, shows as ``**********``, and the value of an unknown key (perhaps a
misspelt secret) is not shown.
pydantic's own error text, which quotes inputs, is never chained to the error raised.
"""

from __future__ import annotations

import logging
import os
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any, TypeVar, get_args

import yaml
from pydantic import BaseModel, SecretStr, ValidationError

from kvgate.config.gateway import GatewayConfig
from kvgate.config.renames import move_old_keys
from kvgate.config.secrets import READ_SECRETS

ENV_PREFIX = "KVGATE_"
ENV_SEPARATOR = "__"
EXAMPLES_DIR = Path(__file__).parent / "examples"

Warn = Callable[[str], None]
"""Where a loader's warnings go: an old key still read, say, one line each."""
View = TypeVar("View", bound=BaseModel)

_log = logging.getLogger("kvgate.config")


def log_warning(message: str) -> None:
    """The default ``Warn``: the ``kvgate.config`` logger."""
    _log.warning("%s", message)


_UNITS = {"_s": "seconds", "_tokens": "tokens", "_bytes": "bytes", "_ratio": "ratio (0..1)"}
_UNITS_BY_NAME = {
    "max_model_len": "tokens",
    "port": "TCP port",
    "bytes_per_token": "bytes per token",
    "max_sequences": "sequences",
    "upstream_connections": "connections",
    "max_connections": "connections",
    "max_headers": "headers",
    "tokenize_concurrency": "prompts",
    "max_sequences_per_request": "sequences",
    "layers": "count",
    "kv_heads": "count",
    "head_dim": "elements",
    "dtype_bytes": "bytes",
    "healthy_threshold": "probes",
    "unhealthy_threshold": "probes",
}


class _Hidden:
    """A value the loader will not print: a secret (shown masked) or an unknown key's (not shown)."""

    def __init__(self, text: str) -> None:
        self._text = text

    def __repr__(self) -> str:
        return self._text


SECRET = _Hidden("**********")
NOT_SHOWN = _Hidden("<not shown>")


@dataclass(frozen=True, slots=True)
class ConfigProblem:
    key: str
    value: Any
    message: str
    unit: str | None

    def __str__(self) -> str:
        unit = f" (unit: {self.unit})" if self.unit else ""
        got = "" if self.value is NOT_SHOWN else f"; got {self.value!r}"
        where = f"{self.key}: " if self.key else ""
        return f"{where}{self.message}{unit}{got}"


class ConfigError(ValueError):
    """Every problem found in a config, reported together."""

    def __init__(self, source: str, problems: list[ConfigProblem]) -> None:
        self.source = source
        self.problems = problems
        if len(problems) == 1:
            super().__init__(f"invalid config {source}: {problems[0]}")
        else:
            lines = "\n".join(f"  - {p}" for p in problems)
            super().__init__(f"invalid config {source}: {len(problems)} problems\n{lines}")


def load_config(
    path: str | Path | None = None,
    environ: Mapping[str, str] | None = None,
    warn: Warn = log_warning,
    read_secrets: bool = True,
) -> GatewayConfig:
    """Read ``path`` (YAML; none means an empty document), apply overrides from ``environ``
    (default ``os.environ``) and validate; ``warn`` gets one line per old key still read.
    ``read_secrets=False`` opens no secret file (``kvgate.config.secrets``): a check of the file
    where its secrets are not mounted."""
    return parse_config(
        read_document(path), os.environ if environ is None else environ, source_of(path), warn, read_secrets
    )


def source_of(path: str | Path | None) -> str:
    """How a config's errors name where it came from."""
    return str(path) if path is not None else "<environment>"


def read_document(path: str | Path | None) -> dict[str, Any]:
    """The YAML mapping in ``path`` (none: an empty one), unvalidated; ``ConfigError`` when the file
    cannot be read, does not parse or is not a mapping."""
    if path is None:
        return {}
    try:
        data = yaml.safe_load(Path(path).read_text()) or {}
    except OSError as exc:
        reason = exc.strerror or str(exc)
        raise ConfigError(str(path), [ConfigProblem("", NOT_SHOWN, f"cannot read: {reason}", None)]) from None
    except yaml.YAMLError as exc:
        raise ConfigError(str(path), [ConfigProblem("", NOT_SHOWN, _yaml_problem(exc), None)]) from None
    if not isinstance(data, dict):
        raise ConfigError(str(path), [ConfigProblem("", NOT_SHOWN, "top level must be a mapping", None)])
    return data


def parse_config(
    data: Mapping[str, Any],
    environ: Mapping[str, str],
    source: str = "<config>",
    warn: Warn = log_warning,
    read_secrets: bool = True,
) -> GatewayConfig:
    return parse_as(GatewayConfig, data, environ, source, warn, read_secrets)


def parse_as(
    view: type[View],
    data: Mapping[str, Any],
    environ: Mapping[str, str],
    source: str,
    warn: Warn,
    read_secrets: bool = True,
) -> View:
    """``data`` with the overrides of ``environ`` and its old keys moved (``kvgate.config.renames``),
    validated as ``view``: ``GatewayConfig``, or the part of it that one command reads, whose
    sections are the gateway's or narrower (``kvgate.config.loop``). What the gateway knows and
    ``view`` does not is left out unchecked; a key that neither knows is an error."""
    merged, problems = apply_env_overrides(data, environ)
    renamed = move_old_keys(merged)
    for line in renamed.warnings:
        warn(line)
    problems.extend(ConfigProblem(c.old, NOT_SHOWN, c.message, None) for c in renamed.clashes)
    try:
        config = view.model_validate(
            _read_by(merged, view, GatewayConfig), context={READ_SECRETS: read_secrets}
        )
    except ValidationError as exc:
        problems.extend(_problems(exc))
        raise ConfigError(source, problems) from None
    if problems:
        raise ConfigError(source, problems)
    return config


def _read_by(data: dict[str, Any], view: type[BaseModel], whole: type[BaseModel]) -> dict[str, Any]:
    """``data`` without the keys that ``whole`` has and ``view`` has not, at every level."""
    kept: dict[str, Any] = {}
    for key, value in data.items():
        if key in view.model_fields:
            inner, outer = _section_of(view, key), _section_of(whole, key)
            if inner is not None and outer is not None and inner is not outer and isinstance(value, dict):
                value = _read_by(value, inner, outer)
            kept[key] = value
        elif key not in whole.model_fields:
            kept[key] = value
    return kept


def _section_of(model: type[BaseModel], key: str) -> type[BaseModel] | None:
    """The section class of ``model``'s field ``key`` (``X | None`` included), if it is one."""
    field = model.model_fields.get(key)
    candidates = [] if field is None else [field.annotation, *get_args(field.annotation)]
    return next((c for c in candidates if isinstance(c, type) and issubclass(c, BaseModel)), None)


def apply_env_overrides(
    data: Mapping[str, Any], environ: Mapping[str, str]
) -> tuple[dict[str, Any], list[ConfigProblem]]:
    """A deep copy of ``data`` with every ``KVGATE_A__B__C`` variable set at ``a.b.c``."""
    merged: dict[str, Any] = yaml.safe_load(yaml.safe_dump(dict(data))) or {}
    problems: list[ConfigProblem] = []
    for name in sorted(environ):
        if not name.startswith(ENV_PREFIX) or ENV_SEPARATOR not in name:
            continue
        parts = name[len(ENV_PREFIX) :].lower().split(ENV_SEPARATOR)
        value = yaml.safe_load(environ[name]) if environ[name] else ""
        if not _set_path(merged, parts, value):
            problems.append(ConfigProblem(".".join(parts), NOT_SHOWN, f"{name} names no settable key", None))
    return merged, problems


def _set_path(node: Any, parts: list[str], value: Any) -> bool:
    for i, part in enumerate(parts):
        last = i == len(parts) - 1
        if isinstance(node, list):
            if not part.isdigit() or int(part) >= len(node):
                return False
            if last:
                node[int(part)] = value
                return True
            node = node[int(part)]
        elif isinstance(node, dict):
            if last:
                node[part] = value
                return True
            node = node.setdefault(part, {})
        else:
            return False
    return False


def _problems(exc: ValidationError) -> list[ConfigProblem]:
    problems = []
    for error in exc.errors(include_url=False):
        loc = [str(p) for p in error["loc"] if not _is_union_tag(p)]
        key = ".".join(loc)
        field = next((p for p in reversed(loc) if not p.isdigit()), "")
        unknown = error["type"] == "extra_forbidden"
        value = NOT_SHOWN if unknown else _redacted(error.get("input"), field)
        message = "unknown key" if unknown else error["msg"]
        problems.append(ConfigProblem(key, value, message, unit_of(field)))
    return problems


def _yaml_problem(exc: yaml.YAMLError) -> str:
    """Where and why the YAML does not parse, without the snippet of the line (it may hold a secret)."""
    if isinstance(exc, yaml.MarkedYAMLError) and exc.problem_mark is not None:
        mark = exc.problem_mark
        return f"not valid YAML at line {mark.line + 1}, column {mark.column + 1}: {exc.problem}"
    return "not valid YAML"


def _secret_fields(model: type[BaseModel], seen: set[type[BaseModel]] | None = None) -> set[str]:
    """Names of every ``SecretStr`` field in ``model`` and the sections under it."""
    seen = set() if seen is None else seen
    seen.add(model)
    names: set[str] = set()
    for name, field in model.model_fields.items():
        pending: list[Any] = [field.annotation]
        while pending:
            annotation = pending.pop()
            if annotation is SecretStr:
                names.add(name)
            elif isinstance(annotation, type) and issubclass(annotation, BaseModel):
                if annotation not in seen:
                    names |= _secret_fields(annotation, seen)
            else:
                pending.extend(get_args(annotation))
    return names


SECRET_FIELDS = frozenset(_secret_fields(GatewayConfig))


def _redacted(value: Any, field: str) -> Any:
    """``value`` with every secret field's value inside it masked."""
    if field in SECRET_FIELDS and value is not None:
        return SECRET
    if isinstance(value, Mapping):
        return {key: _redacted(item, str(key)) for key, item in value.items()}
    if isinstance(value, list | tuple):
        return [_redacted(item, field) for item in value]
    return value


def _is_union_tag(part: object) -> bool:
    return isinstance(part, str) and part in _TOKENIZER_KINDS


_TOKENIZER_KINDS = frozenset({"tiktoken", "tiktoken_file", "replica", "bytes", "huggingface"})


def unit_of(field: str) -> str | None:
    """The unit a field name promises by its suffix (``timeout_s`` → seconds), if any."""
    if field in _UNITS_BY_NAME:
        return _UNITS_BY_NAME[field]
    for suffix, unit in _UNITS.items():
        if field.endswith(suffix):
            return unit
    return None
