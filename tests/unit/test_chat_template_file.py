"""A model's own chat template (``chat_template.file``): its ``tokenizer_config.json`` Jinja source
rendered as vLLM renders it, so the gateway counts the tokens the replica will see."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from kvgate.admission.counting import prompt_of, template_for
from kvgate.admission.tokenizer import JinjaChatTemplate
from kvgate.config.loader import ConfigError, parse_config
from kvgate.config.models import ChatTemplate

LLAMA3 = (
    "{{ bos_token }}{% for message in messages %}"
    "<|start_header_id|>{{ message['role'] }}<|end_header_id|>\n\n{{ message['content'] | trim }}<|eot_id|>"
    "{% endfor %}{% if add_generation_prompt %}<|start_header_id|>assistant<|end_header_id|>\n\n{% endif %}"
)
STRICT = (
    "{% for message in messages %}{% if message['role'] == 'system' %}"
    "{{ raise_exception('System role not supported') }}{% endif %}[{{ message['content'] }}]{% endfor %}"
)


def tokenizer_config(tmp_path: Path, template: object) -> Path:
    path = tmp_path / "tokenizer_config.json"
    path.write_text(
        json.dumps(
            {
                "chat_template": template,
                "bos_token": {"content": "<|begin_of_text|>"},
                "eos_token": "<|eot_id|>",
            }
        )
    )
    return path


def test_the_models_own_template_frames_the_conversation(tmp_path: Path) -> None:
    template = template_for(ChatTemplate(file=str(tokenizer_config(tmp_path, LLAMA3))))
    body = {"messages": [{"role": "user", "content": [{"type": "text", "text": " hi "}]}]}
    assert prompt_of(body, template) == (
        "<|begin_of_text|><|start_header_id|>user<|end_header_id|>\n\nhi<|eot_id|>"
        "<|start_header_id|>assistant<|end_header_id|>\n\n"
    )


def test_a_named_list_of_templates_uses_the_default_and_a_jinja_file_is_read_as_is(tmp_path: Path) -> None:
    named = [{"name": "tool_use", "template": "x"}, {"name": "default", "template": LLAMA3}]
    listed = JinjaChatTemplate.from_file(tokenizer_config(tmp_path, named))
    assert listed.render([{"role": "user", "content": "a"}]).startswith("<|begin_of_text|>")
    jinja = tmp_path / "template.jinja"
    jinja.write_text("{% for m in messages %}<{{ m.role }}>{{ m.content }}{% endfor %}")
    assert JinjaChatTemplate.from_file(jinja).render([{"role": "user", "content": "a"}]) == "<user>a"


def test_a_conversation_the_template_refuses_is_counted_with_the_default_framing(tmp_path: Path) -> None:
    template = JinjaChatTemplate.from_file(tokenizer_config(tmp_path, STRICT))
    assert template.render([{"role": "user", "content": "a"}]) == "[a]"
    assert template.render([{"role": "system", "content": "a"}]) == "<|system|>\na\n<|assistant|>\n"


def test_a_template_file_without_a_template_or_with_framing_is_refused(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match="has no chat_template"):
        JinjaChatTemplate.from_file(tokenizer_config(tmp_path, None))
    data = {
        "models": [
            {
                "name": "m",
                "max_model_len": 8192,
                "kv_bytes_per_token": 131072,
                "chat_template": {"file": "/x/tokenizer_config.json", "bos": "<s>"},
            }
        ],
        "pools": [{"name": "p", "replicas": ["http://127.0.0.1:9100"]}],
    }
    with pytest.raises(ConfigError, match=r"give file or the framing fields \['bos'\]"):
        parse_config(data, {})
