"""Profiles kept in YAML files, such as the one ``kvgate sim calibrate`` writes for an operator's GPUs.

A profile file names a built-in profile to start from (``base``, default the default profile),
optionally its own ``name`` (default: the file's stem), and any profile field by name; a field it
does not set keeps the base's value. It is validated exactly as command-line overrides are, every
problem at once, and overrides given beside it (flags, ``SimFleet(overrides=...)``) win over it.
Wherever a profile is named (``kvgate sim --profile``, ``kvgate up --profile``, ``SimFleet``), a
path to such a file (ending ``.yaml`` or ``.yml``) works too.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import yaml

from kvgate.sim.profile import DEFAULT_PROFILE, PROFILES, Profile, resolve_profile

PROFILE_FILE_SUFFIXES = (".yaml", ".yml")


def load_profile(spec: str, overrides: Mapping[str, Any] | None = None) -> Profile:
    """The built-in profile named ``spec``, or the one in the YAML file at ``spec``, with
    ``overrides`` applied; raises ``ValueError`` listing every problem."""
    if spec in PROFILES or not spec.endswith(PROFILE_FILE_SUFFIXES):
        return resolve_profile(spec, overrides)
    path = Path(spec)
    try:
        document = yaml.safe_load(path.read_text())
    except OSError as exc:
        raise ValueError(f"cannot read profile file {spec}: {exc.strerror or exc}") from None
    except yaml.YAMLError as exc:
        raise ValueError(f"profile file {spec} is not YAML: {exc}") from None
    if not isinstance(document, dict):
        raise ValueError(f"profile file {spec} must hold a mapping of profile fields")
    fields = dict(document)
    base = fields.pop("base", DEFAULT_PROFILE)
    name = fields.pop("name", path.stem)
    if not isinstance(base, str) or not isinstance(name, str):
        raise ValueError(f"profile file {spec}: base and name must be strings")
    try:
        profile = resolve_profile(base, {**fields, **(overrides or {})})
    except ValueError as exc:
        raise ValueError(f"profile file {spec}: {exc}") from None
    return dataclasses.replace(profile, name=name)


def profile_document(base: str, name: str, fields: Mapping[str, Any], notes: list[str]) -> str:
    """A profile file: ``notes`` as comment lines, then ``base``, ``name`` and ``fields`` in order."""
    lines = [f"# {note}" if note else "#" for note in notes]
    body = yaml.safe_dump({"base": base, "name": name, **fields}, sort_keys=False)
    return "\n".join([*lines, body])
