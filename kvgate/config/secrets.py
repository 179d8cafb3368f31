"""Secrets in the config: read from files, kept out of every message the loader prints.

A secret field (``admin_token``, ``api_key``, ...) is a pydantic ``SecretStr``, so a config's repr
and dump show ``**********``. Each can instead be read from a file, ``<field>_file`` (a Kubernetes
or Docker secret mounted as a file; ``KVGATE_..._FILE`` variables set it like any other key), read
once at load time without its trailing newline; a list of keys takes one per line. Giving both the
field and its file is an error, and so is a file that cannot be read or is empty: the message names
the file, never its content.

A check that runs where the secrets are not mounted (``kvgate config check --no-secrets`` in CI)
validates with the context ``{"read_secrets": False}``: each file named is then not opened and its
field holds a stand-in that passes the field's own checks (distinct per file, so two files are two
keys), while every other rule still runs.
"""

from __future__ import annotations

import hashlib
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from pydantic import ValidationInfo

READ_SECRETS = "read_secrets"
"""Validation-context key: False leaves every ``<field>_file`` unread (see the module's docstring)."""


def digits_as_text(value: object) -> object:
    """A secret written as digits (``KVGATE_AUTH__ADMIN_TOKEN=1234``, which YAML reads as a number)
    as the text it was, each item of a list too; for a ``mode="before"`` field validator."""
    if isinstance(value, list | tuple):
        return [digits_as_text(item) for item in value]
    if isinstance(value, int) and not isinstance(value, bool):
        return str(value)
    return value


def _read(field: str, path: object) -> str:
    if not isinstance(path, str) or not path:
        raise ValueError(f"{field}_file must be a file path")
    try:
        text = Path(path).read_text(encoding="utf-8")
    except OSError as exc:
        raise ValueError(f"{field}_file: cannot read {path}: {exc.strerror or type(exc).__name__}") from None
    except UnicodeDecodeError:
        raise ValueError(f"{field}_file: {path} is not UTF-8 text") from None
    text = text.rstrip("\r\n")
    if not text.strip():
        raise ValueError(f"{field}_file: {path} is empty")
    return text


def reads_secrets(info: ValidationInfo | None) -> bool:
    """Whether this validation opens secret files (every one does unless told otherwise)."""
    context = info.context if info is not None else None
    return not (isinstance(context, Mapping) and context.get(READ_SECRETS) is False)


def _stand_in(field: str, path: object) -> str:
    if not isinstance(path, str) or not path:
        raise ValueError(f"{field}_file must be a file path")
    digest = hashlib.sha256(path.encode()).hexdigest()[:12]
    return f"redis://unread-{digest}" if field == "redis_url" else f"unread-{digest}"


def read_secret_files(
    data: Any, fields: tuple[str, ...], lists: tuple[str, ...] = (), info: ValidationInfo | None = None
) -> Any:
    """``data`` (a section's raw mapping) with each ``<field>_file`` read into ``<field>``; the
    ``lists`` fields take one value per non-blank line. For a ``mode="before"`` model validator,
    which passes its ``info`` so a check without secrets (see the module's docstring) reads none."""
    if not isinstance(data, Mapping):
        return data
    read = reads_secrets(info)
    resolved = dict(data)
    for field in (*fields, *lists):
        path = resolved.get(f"{field}_file")
        if path is None:
            continue
        if resolved.get(field) not in (None, (), []):
            raise ValueError(f"give {field} or {field}_file, not both")
        if not read:
            stand_in = _stand_in(field, path)
            resolved[field] = [stand_in] if field in lists else stand_in
            continue
        text = _read(field, path)
        resolved[field] = (
            [line.strip() for line in text.splitlines() if line.strip()] if field in lists else text
        )
    return resolved
