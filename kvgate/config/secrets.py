"""Secrets in the config: read from files, kept out of every message the loader prints.

A secret field (``admin_token``, ``api_key``, ...) is a pydantic ``SecretStr``, so a config's repr
and dump show ``**********``. Each can instead be read from a file, ``<field>_file`` (a Kubernetes
or Docker secret mounted as a file; ``KVGATE_..._FILE`` variables set it like any other key), read
once at load time without its trailing newline; a list of keys takes one per line. Giving both the
field and its file is an error, and so is a file that cannot be read or is empty: the message names
the file, never its content.
"""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path
from typing import Any


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


def read_secret_files(data: Any, fields: tuple[str, ...], lists: tuple[str, ...] = ()) -> Any:
    """``data`` (a section's raw mapping) with each ``<field>_file`` read into ``<field>``; the
    ``lists`` fields take one value per non-blank line. For a ``mode="before"`` model validator."""
    if not isinstance(data, Mapping):
        return data
    resolved = dict(data)
    for field in (*fields, *lists):
        path = resolved.get(f"{field}_file")
        if path is None:
            continue
        if resolved.get(field) not in (None, (), []):
            raise ValueError(f"give {field} or {field}_file, not both")
        text = _read(field, path)
        resolved[field] = (
            [line.strip() for line in text.splitlines() if line.strip()] if field in lists else text
        )
    return resolved
