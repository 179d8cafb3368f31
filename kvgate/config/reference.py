"""The config reference, generated from the schema: one Markdown table per section, a row per key.

Each row is the field's own ``description`` (unit, default and example, which the config tests
require of every field), so the reference cannot drift from what the loader accepts: a test
regenerates ``docs/config-reference.md`` and compares. Nested sections follow their parent: a
list of sections as ``key[]``, a map of them by name as ``key.<name>``. ``kvgate config reference``
prints it; ``kvgate config reference > docs/config-reference.md`` refreshes the file.
"""

from __future__ import annotations

import types
from collections.abc import Iterator
from typing import Any, Union, get_args, get_origin

from pydantic import BaseModel

from kvgate.config.gateway import GatewayConfig

SECTIONS = ("admission", "routing", "autoscaler")
"""The sections the generated file covers (``server`` and the rest are in docs/gateway.md)."""

HEADER = """# Configuration reference: admission, routing, autoscaler

Generated from the schema (`kvgate/config/*.py`) by `kvgate config reference`; do not edit by hand
(`tests/unit/test_config_reference.py` fails when this file is not what the schema gives). The
`server`, `auth`, `health`, `coordination`, `models` and `pools` sections are in
[gateway.md](gateway.md#reference); a whole file using most keys, each explained, is
`kvgate/config/examples/production.yaml`.
"""


def render(sections: tuple[str, ...] = SECTIONS) -> str:
    parts = [HEADER]
    for name in sections:
        field = GatewayConfig.model_fields[name]
        section = _section(field.annotation)
        assert section is not None, name
        parts.extend(_tables(name, section))
    return "\n".join(parts) + "\n"


def _tables(path: str, model: type[BaseModel]) -> Iterator[str]:
    rows = ["| key | description |", "|---|---|"]
    nested: list[tuple[str, type[BaseModel]]] = []
    for key, field in model.model_fields.items():
        required = " **required**" if field.is_required() else ""
        description = (field.description or "").replace("|", "\\|").replace("\n", " ")
        rows.append(f"| `{key}`{required} | {description} |")
        child = _section(field.annotation)
        if child is not None:
            nested.append((f"{path}.{key}{_container(field.annotation)}", child))
    yield f"\n## `{path}`\n\n" + "\n".join(rows)
    for child_path, child in nested:
        yield from _tables(child_path, child)


def _container(annotation: Any) -> str:
    """How a nested section's path is written: ``[]`` for a list, ``.<name>`` for a map by name."""
    origin = get_origin(annotation)
    if origin is tuple:
        return "[]"
    if origin is dict:
        return ".<name>"
    return ""


def _section(annotation: Any) -> type[BaseModel] | None:
    """The section class inside ``annotation`` (``X``, ``X | None``, ``tuple[X, ...]``,
    ``dict[str, X]``), if any."""
    if isinstance(annotation, type) and issubclass(annotation, BaseModel):
        return annotation
    origin = get_origin(annotation)
    if origin in (Union, types.UnionType, tuple, dict):
        for arg in get_args(annotation):
            found = _section(arg)
            if found is not None:
                return found
    return None
