"""The decision core stays pure: no I/O stacks, no event loop, no wall clock, no hidden randomness.

Each module of ``admission/``, ``routing/`` and ``autoscaler/`` is parsed (not imported) and every
import, every ``time.*``/``random.*`` call and every use of the ``random`` module is checked,
wherever it appears (function bodies and ``TYPE_CHECKING`` blocks included), so the rule holds for
code paths no test happens to run. ``random`` may be imported for one thing only: the
``random.Random`` type of an injected, seeded generator, never called or constructed here.
"""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
PURE_PACKAGES = ("kvgate/vocabulary", "kvgate/admission", "kvgate/routing", "kvgate/autoscaler")
EDGES = frozenset({"kvgate/autoscaler/loop.py", "kvgate/autoscaler/actuators.py"})
"""The autoscaling room's two edges: the loop that reads ``/signals`` and the actuators that resize a
fleet. Everything else in the room, the policy and its inputs, is pure."""
FORBIDDEN_MODULES = frozenset(
    {
        "fastapi",
        "starlette",
        "httpx",
        "aiohttp",
        "redis",
        "prometheus_client",
        "asyncio",
        "uvicorn",
        "uvloop",
        "time",
        "socket",
    }
)
FORBIDDEN_CALL_ROOTS = frozenset({"time", "random"})
TYPE_ONLY_MODULES = {"random": frozenset({"Random"})}


def pure_modules() -> list[Path]:
    return sorted(
        p
        for package in PURE_PACKAGES
        for p in (ROOT / package).rglob("*.py")
        if p.relative_to(ROOT).as_posix() not in EDGES
    )


def violations(source: str) -> list[str]:
    found: list[str] = []
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Import):
            found += [
                f"line {node.lineno}: import {a.name}"
                for a in node.names
                if _root(a.name) in FORBIDDEN_MODULES
            ]
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            if _root(node.module) in FORBIDDEN_MODULES:
                found.append(f"line {node.lineno}: from {node.module} import ...")
            allowed = TYPE_ONLY_MODULES.get(node.module)
            if allowed is not None:
                found += [
                    f"line {node.lineno}: from {node.module} import {a.name}"
                    for a in node.names
                    if a.name not in allowed
                ]
        elif isinstance(node, ast.Attribute) and isinstance(node.value, ast.Name):
            allowed = TYPE_ONLY_MODULES.get(node.value.id)
            if allowed is not None and node.attr not in allowed:
                found.append(f"line {node.lineno}: {node.value.id}.{node.attr}")
        if isinstance(node, ast.Call):
            root = _call_root(node.func)
            if root in FORBIDDEN_CALL_ROOTS:
                found.append(f"line {node.lineno}: call {ast.unparse(node.func)}()")
    return found


def _root(module: str) -> str:
    return module.split(".", 1)[0]


def _call_root(func: ast.expr) -> str | None:
    if not isinstance(func, ast.Attribute):
        return None
    value = func.value
    while isinstance(value, ast.Attribute):
        value = value.value
    return value.id if isinstance(value, ast.Name) else None


def test_the_pure_packages_exist() -> None:
    assert (ROOT / "kvgate" / "admission" / "controller.py").exists()
    assert all((ROOT / edge).is_file() for edge in EDGES)
    assert len(pure_modules()) >= 5


@pytest.mark.parametrize("path", pure_modules(), ids=lambda p: str(p.relative_to(ROOT)))
def test_module_is_pure(path: Path) -> None:
    assert violations(path.read_text()) == []


@pytest.mark.parametrize(
    "source",
    [
        "import asyncio",
        "import time as clock",
        "from redis.asyncio import Redis",
        "import prometheus_client.core",
        "from starlette.requests import Request",
        "def f():\n    import socket",
        "from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n    import httpx",
        "x = time.monotonic()",
        "x = random.random()",
        "x = time.time.__call__()",
        "rng = random.Random()",
        "pick = random.choice",
        "from random import choice",
    ],
)
def test_checker_catches(source: str) -> None:
    assert violations(source)


@pytest.mark.parametrize(
    "source",
    [
        "import math",
        "from kvgate.admission.ledger import InMemoryLedger",
        "from . import time",
        "x = rng.random()",
        "import random\ndef f(rng: random.Random) -> float:\n    return rng.random()",
        "from random import Random",
        "x = clock.now_s()",
        "timeout_s = 3",
    ],
)
def test_checker_allows(source: str) -> None:
    assert violations(source) == []
