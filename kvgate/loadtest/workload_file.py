"""Workloads as users write them: a preset by name or a YAML file, validated with every problem at
once, and the command line's values in place of the file's."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import replace
from importlib import resources
from pathlib import Path
from typing import Any

import yaml

from kvgate.loadtest.arrivals import RateStep
from kvgate.loadtest.distributions import is_number, parse_distribution
from kvgate.loadtest.workload import RequestClass, Workload

PRESETS = ("chat", "summarize", "mixed", "shared-prefix", "burst", "overload")


def load_workload(name_or_path: str) -> Workload:
    """A preset by name (see ``PRESETS``) or a YAML file with the same keys."""
    path = Path(name_or_path)
    if path.suffix in (".yaml", ".yml") or path.exists():
        text = path.read_text()
    elif name_or_path in PRESETS:
        text = resources.files("kvgate.loadtest").joinpath("workloads", f"{name_or_path}.yaml").read_text()
    else:
        raise ValueError(
            f"unknown workload {name_or_path!r}: not a file, and presets are {', '.join(PRESETS)}"
        )
    data = yaml.safe_load(text)
    if not isinstance(data, Mapping):
        raise ValueError(f"workload {name_or_path!r} must be a mapping")
    return parse_workload(data, default_name=path.stem)


def parse_workload(data: Mapping[str, Any], default_name: str = "workload") -> Workload:
    """Validate a workload mapping, collecting every problem before failing."""
    errors: list[str] = []
    known = {
        "name", "description", "api", "duration_s", "rate_rps", "concurrency", "process", "cv",
        "schedule", "max_requests", "slo_ttft_s", "slo_itl_s", "ignore_eos", "temperature",
        "request_timeout_s", "classes",
    }  # fmt: skip
    errors += [f"unknown key {key!r}" for key in data if key not in known]
    classes: list[RequestClass] = []
    raw_classes = data.get("classes")
    if not isinstance(raw_classes, list) or not raw_classes:
        errors.append("classes: need a non-empty list")
        raw_classes = []
    for i, raw in enumerate(raw_classes):
        klass = _parse_class(raw, f"classes[{i}]", errors)
        if klass is not None:
            classes.append(klass)
    schedule: list[RateStep] = []
    for i, step in enumerate(data.get("schedule") or []):
        if isinstance(step, list | tuple) and len(step) == 2 and all(is_number(x) for x in step):
            schedule.append(RateStep(float(step[0]), float(step[1])))
        else:
            errors.append(f"schedule[{i}]: want [at_ratio, rate_x], got {step!r}")
    api = data.get("api", "chat")
    if api not in ("chat", "completions"):
        errors.append(f"api: want 'chat' or 'completions', got {api!r}")
    process = data.get("process", "poisson")
    if process not in ("poisson", "gamma"):
        errors.append(f"process: want 'poisson' or 'gamma', got {process!r}")
    numbers = {
        "duration_s": 30.0,
        "rate_rps": 2.0,
        "cv": 1.0,
        "slo_ttft_s": 2.0,
        "slo_itl_s": 0.1,
        "temperature": 0.0,
        "request_timeout_s": 600.0,
    }
    values: dict[str, float] = {}
    for key, default in numbers.items():
        value = data.get(key, default)
        if not is_number(value) or (key != "temperature" and value <= 0):
            errors.append(f"{key}: want a positive number, got {value!r}")
            value = default
        values[key] = float(value)
    optional_ints: dict[str, int | None] = {}
    for key in ("concurrency", "max_requests"):
        value = data.get(key)
        if value is not None and (not isinstance(value, int) or value <= 0):
            errors.append(f"{key}: want a positive integer, got {value!r}")
            value = None
        optional_ints[key] = value
    if errors:
        raise ValueError("invalid workload: " + "; ".join(errors))
    return Workload(
        name=str(data.get("name", default_name)),
        description=str(data.get("description", "")),
        classes=tuple(classes),
        api=api,
        duration_s=values["duration_s"],
        rate_rps=values["rate_rps"],
        concurrency=optional_ints["concurrency"],
        process=process,
        cv=values["cv"],
        schedule=tuple(schedule),
        max_requests=optional_ints["max_requests"],
        slo_ttft_s=values["slo_ttft_s"],
        slo_itl_s=values["slo_itl_s"],
        ignore_eos=bool(data.get("ignore_eos", True)),
        temperature=values["temperature"],
        request_timeout_s=values["request_timeout_s"],
    )


def _parse_class(raw: Any, where: str, errors: list[str]) -> RequestClass | None:
    if not isinstance(raw, Mapping):
        errors.append(f"{where}: want a mapping, got {raw!r}")
        return None
    known = {
        "name", "weight", "prompt_tokens", "output_tokens", "system_prompts", "system_prompt_tokens",
        "turns", "live_sessions",
    }  # fmt: skip
    errors += [f"{where}: unknown key {key!r}" for key in raw if key not in known]
    weight = raw.get("weight", 1.0)
    if not is_number(weight) or weight <= 0:
        errors.append(f"{where}.weight: want a positive number, got {weight!r}")
        weight = 1.0
    counts: dict[str, int] = {}
    for key, default in (("system_prompts", 0), ("live_sessions", 8)):
        value = raw.get(key, default)
        if not isinstance(value, int) or value < 0:
            errors.append(f"{where}.{key}: want an integer >= 0, got {value!r}")
            value = default
        counts[key] = value
    return RequestClass(
        name=str(raw.get("name", where)),
        weight=float(weight),
        prompt_tokens=parse_distribution(raw.get("prompt_tokens"), f"{where}.prompt_tokens", errors),
        output_tokens=parse_distribution(raw.get("output_tokens"), f"{where}.output_tokens", errors),
        system_prompts=counts["system_prompts"],
        system_prompt_tokens=parse_distribution(
            raw.get("system_prompt_tokens", 0), f"{where}.system_prompt_tokens", errors
        ),
        turns=parse_distribution(raw.get("turns", 1), f"{where}.turns", errors),
        live_sessions=counts["live_sessions"],
    )


def with_overrides(
    workload: Workload,
    *,
    duration_s: float | None = None,
    rate_rps: float | None = None,
    concurrency: int | None = None,
    max_requests: int | None = None,
    slo_ttft_s: float | None = None,
    slo_itl_s: float | None = None,
) -> Workload:
    """The workload with command-line values in place of its own; a rate makes it open loop."""
    changes: dict[str, Any] = {}
    if duration_s is not None:
        changes["duration_s"] = duration_s
    if rate_rps is not None:
        changes["rate_rps"] = rate_rps
        changes["concurrency"] = None
    if concurrency is not None:
        changes["concurrency"] = concurrency
    if max_requests is not None:
        changes["max_requests"] = max_requests
    if slo_ttft_s is not None:
        changes["slo_ttft_s"] = slo_ttft_s
    if slo_itl_s is not None:
        changes["slo_itl_s"] = slo_itl_s
    return replace(workload, **changes)
