"""Which room may import which: the table in docs/architecture.md, enforced.

Every module of ``kvgate/`` and ``bench/`` is parsed (not imported) and each import of one of the
project's rooms, wherever it stands (function bodies included), must be an arrow the table allows.
The runtime (``kvgate.gateway`` and the pure cores) never imports the simulator, the load tester or
the benchmarks; only ``kvgate.cli``, the command line's composition root, may import every room,
and nothing installed imports ``bench``, which is not installed.
"""

from __future__ import annotations

import ast
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
CORES = frozenset({"kvgate.config", "kvgate.vocabulary"})
ALLOWED: dict[str, frozenset[str]] = {
    "kvgate.config": frozenset(),
    "kvgate.vocabulary": frozenset(),
    "kvgate.admission": CORES,
    "kvgate.routing": CORES,
    "kvgate.autoscaler": CORES,
    "kvgate.gateway": CORES | {"kvgate.admission", "kvgate.routing", "kvgate.autoscaler"},
    "kvgate.sim": CORES | {"kvgate.admission", "kvgate.routing"},
    "kvgate.loadtest": CORES | {"kvgate.admission"},
    "kvgate.cli": CORES
    | {
        "kvgate.admission",
        "kvgate.routing",
        "kvgate.autoscaler",
        "kvgate.gateway",
        "kvgate.sim",
        "kvgate.loadtest",
    },
    "kvgate": frozenset({"kvgate.cli"}),
}
ROOMS = frozenset(ALLOWED) | {"bench"}
EVERYTHING = frozenset(ALLOWED) - {"kvgate"}


def room_of(module: str) -> str | None:
    """``kvgate.gateway.edge.app`` -> ``kvgate.gateway``; ``bench.harness.peers`` -> ``bench``."""
    parts = module.split(".")
    if parts[0] == "bench":
        return "bench"
    if parts[0] != "kvgate":
        return None
    if len(parts) == 1 or f"kvgate.{parts[1]}" not in ALLOWED:
        return "kvgate"
    return f"kvgate.{parts[1]}"


def arrows(room: str, source: str) -> set[str]:
    """The rooms that ``source`` (a module of ``room``) imports."""
    found: set[str] = set()
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Import):
            found |= {r for alias in node.names if (r := room_of(alias.name))}
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            if node.module == "kvgate":
                found |= {r for alias in node.names if (r := room_of(f"kvgate.{alias.name}"))}
            elif r := room_of(node.module):
                found.add(r)
    return found - {room}


def wrong_way(room: str, source: str) -> set[str]:
    allowed = EVERYTHING if room == "bench" else ALLOWED[room]
    return arrows(room, source) - allowed


def modules() -> list[tuple[str, Path]]:
    out = []
    for path in sorted([*(ROOT / "kvgate").rglob("*.py"), *(ROOT / "bench").rglob("*.py")]):
        dotted = ".".join(path.relative_to(ROOT).with_suffix("").parts)
        room = room_of(dotted)
        assert room is not None
        out.append((room, path))
    return out


def test_every_import_between_rooms_is_an_allowed_arrow() -> None:
    problems = [
        f"{path.relative_to(ROOT)} imports {sorted(bad)}"
        for room, path in modules()
        if (bad := wrong_way(room, path.read_text()))
    ]
    assert problems == []


def test_every_room_is_in_the_table() -> None:
    found = {room for room, _ in modules()}
    assert found == ROOMS
    assert {p.name for p in (ROOT / "kvgate").iterdir() if (p / "__init__.py").is_file()} == {
        room.removeprefix("kvgate.") for room in ALLOWED if room != "kvgate"
    }


def test_the_runtime_never_imports_the_load_tester_or_the_benchmarks() -> None:
    runtime = ("kvgate.config", "kvgate.vocabulary", "kvgate.admission", "kvgate.routing")
    for room in (*runtime, "kvgate.autoscaler", "kvgate.gateway"):
        assert not ALLOWED[room] & {"kvgate.sim", "kvgate.loadtest", "kvgate.cli", "bench"}
    assert not any("bench" in allowed for allowed in ALLOWED.values())


def test_a_new_wrong_way_arrow_is_caught_even_inside_a_function() -> None:
    source = (
        "def up():\n    from kvgate.sim.fleet import SimFleet\n"
        "    import kvgate.cli\n    import bench.harness.peers\n"
    )
    assert wrong_way("kvgate.gateway", source) == {"kvgate.sim", "kvgate.cli", "bench"}
    assert wrong_way("kvgate.cli", source) == {"bench"}
    assert wrong_way("bench", source) == set()
    assert wrong_way("kvgate.routing", "from kvgate import admission\n") == {"kvgate.admission"}


def test_one_name_is_installed() -> None:
    """``pip install kvgate`` puts one importable name into site-packages: ``kvgate``."""
    from setuptools import find_packages

    assert {name.split(".")[0] for name in find_packages(ROOT, include=["kvgate*"])} == {"kvgate"}
    assert find_packages(ROOT, include=["bench*"])  # the benchmarks exist, outside the wheel


def test_the_command_line_runs_without_the_optional_extras() -> None:
    """``pip install kvgate`` without extras: the gateway's commands work, and the load tester's
    report asks for its extra in one line instead of failing on an import."""
    blocked = "import sys; sys.modules.update(dict.fromkeys(['matplotlib', 'kubernetes']))"
    script = (
        f"{blocked}\nfrom kvgate.cli import main\n"
        "assert main(['config', 'check', 'kvgate/config/examples/static.yaml']) == 0\n"
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
