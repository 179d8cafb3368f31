"""The generated config reference is current, and production.yaml passes ``config check`` with
every key it uses explained."""

from __future__ import annotations

from pathlib import Path

import pytest

from kvgate.cli import main
from kvgate.config.loader import EXAMPLES_DIR, load_config
from kvgate.config.reference import SECTIONS, render

ROOT = Path(__file__).resolve().parents[2]
REFERENCE = ROOT / "docs" / "config-reference.md"
PRODUCTION = EXAMPLES_DIR / "production.yaml"


def test_the_generated_reference_is_current() -> None:
    assert REFERENCE.read_text() == render(), (
        "docs/config-reference.md is not what the schema gives: "
        "run `kvgate config reference > docs/config-reference.md`"
    )


def test_the_reference_covers_every_key_of_its_sections() -> None:
    text = render()
    for section in SECTIONS:
        assert f"## `{section}`" in text
    for nested in ("admission.tenants[]", "admission.models.<name>", "autoscaler.pools.<name>"):
        assert f"## `{nested}`" in text
    assert "| `scale_in_window_s` |" in text and "| `ttft_tolerance_s` |" in text


def test_production_passes_the_check_without_its_secrets(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["config", "check", "--no-secrets", str(PRODUCTION)]) == 0
    assert "ok (1 model(s), 1 pool(s)" in capsys.readouterr().out


def test_production_loads_with_its_secrets_mounted(tmp_path: Path) -> None:
    """The paths it names are moved to files here by the variables an operator would set."""
    environ = {}
    for variable, name, text in [
        ("KVGATE_AUTH__ADMIN_TOKEN_FILE", "admin-token", "a1\n"),
        ("KVGATE_AUTH__OBSERVABILITY_TOKEN_FILE", "metrics-token", "m1\n"),
        ("KVGATE_AUTH__TENANTS__0__API_KEYS_FILE", "assistant-keys", "sk-a1\nsk-a2\n"),
        ("KVGATE_AUTH__TENANTS__1__API_KEYS_FILE", "batch-keys", "sk-b1\n"),
        ("KVGATE_COORDINATION__REDIS_URL_FILE", "redis-url", "redis://:pw@redis:6379/0\n"),
        ("KVGATE_POOLS__0__API_KEY_FILE", "vllm-api-key", "sk-vllm\n"),
    ]:
        (tmp_path / name).write_text(text)
        environ[variable] = str(tmp_path / name)
    config = load_config(PRODUCTION, environ)
    assert [len(t.api_keys) for t in config.auth.tenants] == [2, 1]
    assert config.admission.model_rules("meta-llama/Llama-3.1-8B-Instruct").ttft_slo_s == 2
    priorities = {t.name: t.priority for t in config.admission.tenants}
    assert priorities == {"assistant": "critical", "batch": "sheddable"}


def test_every_key_of_production_is_explained() -> None:
    """Each line that sets a value carries a comment, or sits in a block whose key line does."""
    blocks: list[tuple[int, bool]] = []
    """The enclosing block keys: indentation, and whether the key line carries a comment."""
    unexplained = []
    for number, line in enumerate(PRODUCTION.read_text().splitlines(), 1):
        content, _, comment = line.partition(" #")
        if not content.strip() or content.strip().startswith("#"):
            continue
        indent = len(content) - len(content.lstrip(" -"))
        blocks = [(i, c) for i, c in blocks if i < indent]
        _, _, value = content.strip(" -").partition(":")
        if value.strip():
            if not comment and not any(c for _, c in blocks):
                unexplained.append(f"{number}: {line}")
        else:
            blocks.append((indent, bool(comment)))
    assert not unexplained, "\n".join(unexplained)
