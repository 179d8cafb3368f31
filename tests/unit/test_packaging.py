"""What a wheel of kvgate ships, read from the build configuration (building one takes longer than
a unit test should): the one root package ``kvgate`` and its data, never the benchmarks (``bench``),
the tests or a second top-level name that would shadow a user's own module."""

from __future__ import annotations

import ast
import tomllib
from pathlib import Path

from setuptools import find_packages

ROOT = Path(__file__).resolve().parents[2]
PYPROJECT = tomllib.loads((ROOT / "pyproject.toml").read_text())


def _shipped_packages() -> list[str]:
    found = PYPROJECT["tool"]["setuptools"]["packages"]["find"]
    return find_packages(
        str(ROOT / found.get("where", ["."])[0]),
        include=found.get("include", ["*"]),
        exclude=found.get("exclude", ()),
    )


def test_the_wheel_ships_one_top_level_name() -> None:
    packages = _shipped_packages()
    assert "kvgate" in packages and "kvgate.gateway.edge" in packages
    assert {name.split(".")[0] for name in packages} == {"kvgate"}


def test_the_benchmarks_and_the_tests_stay_out_of_the_wheel() -> None:
    packages = _shipped_packages()
    assert not [name for name in packages if name.split(".")[0] in {"bench", "tests"}]
    assert (ROOT / "bench" / "__init__.py").is_file() and (ROOT / "tests" / "__init__.py").is_file()


def test_every_package_data_entry_belongs_to_a_shipped_package() -> None:
    data = PYPROJECT["tool"]["setuptools"].get("package-data", {})
    assert set(data) <= set(_shipped_packages())


def test_setup_py_adds_extensions_only_never_packages() -> None:
    """``setup.py`` exists for the optional mypyc build; packages come from pyproject.toml alone."""
    tree = ast.parse((ROOT / "setup.py").read_text())
    keywords = {
        keyword.arg
        for node in ast.walk(tree)
        if isinstance(node, ast.Call) and getattr(node.func, "id", None) == "setup"
        for keyword in node.keywords
    }
    assert keywords and not keywords & {"packages", "py_modules", "package_dir"}
