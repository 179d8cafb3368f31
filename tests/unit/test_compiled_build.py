"""The optional compiled build names its modules in ``setup.py``; a module renamed or removed there
would break ``make compile`` only for whoever runs it next. Read as text (running ``setup.py``
would call setuptools), its lists are checked against the tree, and against the modules it says must
stay interpreted."""

from __future__ import annotations

import ast
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
ALWAYS_INTERPRETED = {
    "kvgate/gateway/edge/http_protocol.py",
    "kvgate/gateway/edge/errors.py",
    "kvgate/vocabulary/value.py",
}


def _constant(name: str) -> object:
    tree = ast.parse((ROOT / "setup.py").read_text())
    for node in tree.body:
        targets = [node.target] if isinstance(node, ast.AnnAssign) else getattr(node, "targets", [])
        if any(isinstance(t, ast.Name) and t.id == name for t in targets):
            assert node.value is not None
            return ast.literal_eval(node.value)
    raise AssertionError(f"{name} not in setup.py")


def test_every_module_the_compiled_build_names_exists() -> None:
    gateway = _constant("COMPILED_GATEWAY")
    assert isinstance(gateway, tuple) and gateway
    missing = [name for name in gateway if not (ROOT / "kvgate" / "gateway" / f"{name}.py").is_file()]
    assert missing == []
    packages = _constant("COMPILED_PACKAGES")
    assert isinstance(packages, tuple)
    assert [p for p in packages if not (ROOT / p / "__init__.py").is_file()] == []


def test_the_modules_that_cannot_be_compiled_are_left_out() -> None:
    names = _constant("COMPILED_GATEWAY")
    packages = _constant("COMPILED_PACKAGES")
    interpreted = _constant("INTERPRETED")
    assert isinstance(names, tuple) and isinstance(packages, tuple) and isinstance(interpreted, set)
    named = {f"kvgate/gateway/{name}.py" for name in names}
    swept = {
        path.relative_to(ROOT).as_posix() for package in packages for path in (ROOT / package).glob("*.py")
    }
    assert not named & ALWAYS_INTERPRETED
    assert swept & ALWAYS_INTERPRETED <= interpreted
