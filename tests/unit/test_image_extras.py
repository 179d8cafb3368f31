"""The image carries every extra a documented option needs, and its build-time checks run what
they name: each extra's modules import, and the shipped configs pass ``kvgate config check``."""

from __future__ import annotations

import re
import shlex
import subprocess
import sys
import tomllib

from tests.unit.test_deploy import ROOT, _dockerfile_instructions

EXTRAS = {"k8s", "otel", "hf"}
"""The autoscaler's Kubernetes actuator, tracing, a model's own tokenizer.json and chat template."""


def _runs() -> list[str]:
    return [value for kind, value in _dockerfile_instructions() if kind == "RUN"]


def test_the_image_installs_the_otel_hf_and_k8s_extras() -> None:
    extras = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["optional-dependencies"]
    assert set(extras) >= EXTRAS
    installs = [m.group(1) for run in _runs() for m in re.finditer(r'kvgate-\*\.whl\)\[([a-z0-9,]+)\]"', run)]
    assert installs and set(installs[-1].split(",")) >= EXTRAS, installs
    build = [m.group(1) for run in _runs() for m in re.finditer(r'"\.\[([a-z0-9,]+)\]"', run)]
    assert build and set(build[0].split(",")) >= EXTRAS, build


def test_the_image_checks_run_here() -> None:
    """The python -c checks of the last stage, run by this interpreter (which has the dev extra, so
    every extra): a module that moved or an import that fails breaks the build, so it fails here."""
    checks = [
        shlex.split(part.strip().removeprefix("--network=none").strip())
        for part in _runs()[-1].split("&&")
        if "python -c" in part and "pathlib" not in part
    ]
    assert len(checks) >= 2
    for argv in checks:
        assert argv[:2] == ["python", "-c"], argv
        result = subprocess.run([sys.executable, "-c", argv[2]], capture_output=True, text=True, timeout=120)
        assert result.returncode == 0, result.stderr
    assert "production.yaml" in _runs()[-1] and "--no-secrets" in _runs()[-1]
