"""Which package may import which: the table in docs/architecture.md, enforced.

Every module of every package is parsed (not imported) and each import of one of the project's
packages, wherever it stands (function bodies included), must be an arrow the table allows. The
runtime (``gateway/`` and the pure cores) never imports the load tester; only ``kvgate/``, the
command line's composition root, may import everything.
"""

from __future__ import annotations

import ast
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
ALLOWED: dict[str, frozenset[str]] = {
    "config": frozenset(),
    "vocabulary": frozenset(),
    "admission": frozenset({"config", "vocabulary"}),
    "routing": frozenset({"config", "vocabulary"}),
    "autoscaler": frozenset({"config", "vocabulary"}),
    "gateway": frozenset({"config", "vocabulary", "admission", "routing", "autoscaler"}),
    "loadtest": frozenset({"config", "vocabulary", "admission", "routing", "autoscaler", "gateway"}),
    "kvgate": frozenset(
        {"config", "vocabulary", "admission", "routing", "autoscaler", "gateway", "loadtest"}
    ),
}


def arrows(package: str, source: str) -> set[str]:
    """The project's packages that ``source`` (a module of ``package``) imports."""
    found: set[str] = set()
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Import):
            found |= {alias.name.split(".")[0] for alias in node.names}
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            found.add(node.module.split(".")[0])
    return (found & ALLOWED.keys()) - {package}


def wrong_way(package: str, source: str) -> set[str]:
    return arrows(package, source) - ALLOWED[package]


def test_every_import_between_packages_is_an_allowed_arrow() -> None:
    problems = [
        f"{path.relative_to(ROOT)} imports {sorted(bad)}"
        for package in ALLOWED
        for path in sorted((ROOT / package).rglob("*.py"))
        if (bad := wrong_way(package, path.read_text()))
    ]
    assert problems == []


def test_the_runtime_never_imports_the_load_tester() -> None:
    for package in ("config", "vocabulary", "admission", "routing", "autoscaler", "gateway"):
        assert "loadtest" not in ALLOWED[package] and "kvgate" not in ALLOWED[package]


def test_a_new_wrong_way_arrow_is_caught_even_inside_a_function() -> None:
    source = "def up():\n    from loadtest.sim.fleet import SimFleet\n    import kvgate.cli\n"
    assert wrong_way("gateway", source) == {"loadtest", "kvgate"}
    assert wrong_way("kvgate", source) == set()


def test_the_command_line_runs_without_the_optional_extras() -> None:
    """``pip install kvgate`` without extras: the gateway's commands work, and the load tester's
    report asks for its extra in one line instead of failing on an import."""
    blocked = "import sys; sys.modules.update(dict.fromkeys(['matplotlib', 'kubernetes']))"
    script = (
        f"{blocked}\nfrom kvgate.cli import main\n"
        "assert main(['config', 'check', 'config/examples/static.yaml']) == 0\n"
        "code = main(['loadtest', '--target', 'http://127.0.0.1:9', '--duration', '1'])\n"
        "assert code == 2, code\n"
    )
    done = subprocess.run(
        [sys.executable, "-c", script], cwd=ROOT, capture_output=True, text=True, timeout=60, check=False
    )
    assert done.returncode == 0, done.stderr
    assert done.stderr.strip() == (
        "kvgate loadtest: error: the report's plots need matplotlib: pip install 'kvgate[loadtest]'"
    )
