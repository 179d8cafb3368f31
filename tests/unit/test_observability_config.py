"""The ``access_log`` and ``tracing`` sections: documented defaults, bad values reported with their
unit, and tracing asked for without the ``otel`` extra refused at start-up in one line."""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any

import pytest
import yaml

from kvgate.cli import main
from kvgate.config.loader import parse_config
from tests.unit.test_config import MINIMAL, problems_of


def test_access_log_is_on_in_json_for_every_request_and_tracing_is_off_by_default() -> None:
    config = parse_config(MINIMAL, {})
    assert (config.access_log.enabled, config.access_log.format) == (True, "json")
    assert config.access_log.sample_ratio == 1.0
    assert config.tracing.enabled is False
    assert config.tracing.sample_ratio == 1.0 and config.tracing.exporter == "otlp"


def test_bad_values_are_reported_with_their_unit() -> None:
    problems = problems_of(
        {**MINIMAL, "access_log": {"sample_ratio": 1.5, "format": "xml"}, "tracing": {"sample_ratio": -1}}
    )
    assert "ratio (0..1)" in problems["access_log.sample_ratio"]
    assert "access_log.format" in problems
    assert "ratio (0..1)" in problems["tracing.sample_ratio"]


def test_env_overrides_reach_the_sections() -> None:
    environ = {"KVGATE_ACCESS_LOG__FORMAT": "text", "KVGATE_TRACING__SAMPLE_RATIO": "0.25"}
    config = parse_config(MINIMAL, environ)
    assert config.access_log.format == "text" and config.tracing.sample_ratio == 0.25


def test_tracing_without_the_otel_extra_fails_at_start_up_in_one_line(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.setitem(sys.modules, "opentelemetry.sdk", None)
    path = tmp_path / "traced.yaml"
    data: dict[str, Any] = {**MINIMAL, "tracing": {"enabled": True}}
    path.write_text(yaml.safe_dump(data))
    assert main(["serve", "--config", str(path)]) == 2
    lines = capsys.readouterr().err.splitlines()
    assert len(lines) == 1
    assert lines[0].startswith("kvgate serve: error: ") and "tracing: " in lines[0]
    assert "pip install 'kvgate[otel]'" in lines[0]
    assert main(["config", "check", str(path)]) == 2
