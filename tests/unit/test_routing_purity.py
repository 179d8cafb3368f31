from __future__ import annotations

import ast
from pathlib import Path

import routing

FORBIDDEN_MODULES = {
    "asyncio",
    "time",
    "fastapi",
    "starlette",
    "httpx",
    "aiohttp",
    "redis",
    "prometheus_client",
    "socket",
    "uvicorn",
}


def _routing_sources() -> list[Path]:
    return sorted(Path(routing.__file__).parent.rglob("*.py"))


def test_routing_imports_nothing_impure() -> None:
    offences: list[str] = []
    for path in _routing_sources():
        for node in ast.walk(ast.parse(path.read_text())):
            names: list[str] = []
            if isinstance(node, ast.Import):
                names = [alias.name for alias in node.names]
            elif isinstance(node, ast.ImportFrom) and node.module:
                names = [node.module]
            offences += [f"{path.name}: {name}" for name in names if name.split(".")[0] in FORBIDDEN_MODULES]
    assert offences == []


def test_random_is_used_only_as_an_injected_type() -> None:
    offences: list[str] = []
    for path in _routing_sources():
        tree = ast.parse(path.read_text())
        for node in ast.walk(tree):
            if isinstance(node, ast.ImportFrom) and node.module == "random":
                offences.append(f"{path.name}: from random import ...")
            if (
                isinstance(node, ast.Attribute)
                and isinstance(node.value, ast.Name)
                and node.value.id == "random"
                and node.attr != "Random"
            ):
                offences.append(f"{path.name}:{node.lineno}: random.{node.attr}")
    assert offences == []
