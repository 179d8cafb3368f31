"""Load a config: YAML file, then ``KVGATE_*`` environment overrides, then validation.

Overrides name a path into the document with double underscores: ``KVGATE_SERVER__PORT=9000`` sets
``server.port``, ``KVGATE_POOLS__0__KV_CAPACITY_TOKENS=200000`` sets a field of the first pool.
Each value is parsed as YAML, so ``KVGATE_POOLS__0__REPLICAS='[http://a:8000]'`` gives a list.
Variables without a double underscore (``KVGATE_REQUIRE_REDIS``) are not overrides. Validation
reports every bad key at once, each with its value and the unit its name implies.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml
from pydantic import ValidationError

from config.schema import GatewayConfig

ENV_PREFIX = "KVGATE_"
ENV_SEPARATOR = "__"
EXAMPLES_DIR = Path(__file__).parent / "examples"

_UNITS = {"_s": "seconds", "_tokens": "tokens", "_bytes": "bytes", "_ratio": "ratio (0..1)"}
_UNITS_BY_NAME = {
    "max_model_len": "tokens",
    "port": "TCP port",
    "bytes_per_token": "bytes per token",
    "max_sequences": "sequences",
    "upstream_connections": "connections",
    "layers": "count",
    "kv_heads": "count",
    "head_dim": "elements",
    "dtype_bytes": "bytes",
    "healthy_threshold": "probes",
    "unhealthy_threshold": "probes",
}


@dataclass(frozen=True, slots=True)
class ConfigProblem:
    key: str
    value: Any
    message: str
    unit: str | None

    def __str__(self) -> str:
        unit = f" (unit: {self.unit})" if self.unit else ""
        return f"{self.key or '<root>'}: {self.message}{unit}; got {self.value!r}"


class ConfigError(ValueError):
    """Every problem found in a config, reported together."""

    def __init__(self, source: str, problems: list[ConfigProblem]) -> None:
        self.source = source
        self.problems = problems
        lines = "\n".join(f"  - {p}" for p in problems)
        super().__init__(f"invalid config {source}: {len(problems)} problem(s)\n{lines}")


def load_config(path: str | Path | None = None, environ: Mapping[str, str] | None = None) -> GatewayConfig:
    """Read ``path`` (YAML; none means an empty document), apply overrides from ``environ``
    (default ``os.environ``) and validate."""
    source = str(path) if path is not None else "<environment>"
    data: Any = {}
    if path is not None:
        try:
            data = yaml.safe_load(Path(path).read_text()) or {}
        except (OSError, yaml.YAMLError) as exc:
            raise ConfigError(source, [ConfigProblem("", str(path), f"cannot read: {exc}", None)]) from exc
    if not isinstance(data, dict):
        raise ConfigError(source, [ConfigProblem("", data, "top level must be a mapping", None)])
    return parse_config(data, os.environ if environ is None else environ, source)


def parse_config(
    data: Mapping[str, Any], environ: Mapping[str, str], source: str = "<config>"
) -> GatewayConfig:
    merged, problems = apply_env_overrides(data, environ)
    try:
        config = GatewayConfig.model_validate(merged)
    except ValidationError as exc:
        problems.extend(_problems(exc))
        raise ConfigError(source, problems) from exc
    if problems:
        raise ConfigError(source, problems)
    return config


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
            problems.append(
                ConfigProblem(".".join(parts), environ[name], f"{name} names no settable key", None)
            )
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
        value = error.get("input")
        message = "unknown key" if error["type"] == "extra_forbidden" else error["msg"]
        problems.append(ConfigProblem(key, value, message, unit_of(field)))
    return problems


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
