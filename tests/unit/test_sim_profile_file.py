"""Profiles in YAML files: a base, a name and fields, validated as overrides are, every problem at
once; what ``kvgate sim calibrate`` writes loads back as it was written."""

from __future__ import annotations

from pathlib import Path

import pytest

from kvgate.sim.profile import DEFAULT_PROFILE, PROFILES
from kvgate.sim.profile_file import load_profile, profile_document


def test_a_built_in_name_is_the_built_in_profile() -> None:
    assert load_profile(DEFAULT_PROFILE) == PROFILES[DEFAULT_PROFILE]
    with pytest.raises(ValueError, match="unknown profile"):
        load_profile("gpt-5-on-a-toaster")


def test_a_file_starts_from_its_base_and_flags_win_over_it(tmp_path: Path) -> None:
    path = tmp_path / "cpu-tiny.yaml"
    path.write_text(
        profile_document(
            "llama-3.1-70b-4xh100",
            "tiny on two cores",
            {"t_fixed_s": 0.003, "seq_overhead_s": 0.0002, "max_num_seqs": 128},
            ["written by a test", ""],
        )
    )
    assert path.read_text().startswith("# written by a test\n#\nbase: llama-3.1-70b-4xh100\n")
    profile = load_profile(str(path), {"max_num_seqs": 64})
    assert profile.name == "tiny on two cores"
    assert (profile.t_fixed_s, profile.seq_overhead_s, profile.max_num_seqs) == (0.003, 0.0002, 64)
    assert profile.kv_bytes_per_token == PROFILES["llama-3.1-70b-4xh100"].kv_bytes_per_token


def test_a_file_without_base_or_name_takes_the_default_and_its_stem(tmp_path: Path) -> None:
    path = tmp_path / "fitted.yml"
    path.write_text("t_fixed_s: 0.01\n")
    profile = load_profile(str(path))
    assert (profile.name, profile.t_fixed_s) == ("fitted", 0.01)
    assert profile.max_num_seqs == PROFILES[DEFAULT_PROFILE].max_num_seqs


@pytest.mark.parametrize(
    ("content", "problems"),
    [
        ("bogus: 1\nmax_num_seqs: 0\n", ["unknown profile field 'bogus'", "max_num_seqs=0"]),
        ("- a list\n", ["must hold a mapping"]),
        ("base: nope\n", ["unknown profile 'nope'"]),
        ("t_fixed_s: [\n", ["is not YAML"]),
    ],
)
def test_a_bad_file_names_every_problem(tmp_path: Path, content: str, problems: list[str]) -> None:
    path = tmp_path / "bad.yaml"
    path.write_text(content)
    with pytest.raises(ValueError) as error:
        load_profile(str(path))
    assert all(problem in str(error.value) for problem in problems), str(error.value)


def test_a_missing_file_says_so(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match="cannot read profile file"):
        load_profile(str(tmp_path / "absent.yaml"))
