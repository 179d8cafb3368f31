from __future__ import annotations

import importlib.util
import json
import sys
from pathlib import Path

import pytest

from kvgate.admission.counting import prompt_of, template_for, tokenizer_for
from kvgate.admission.tokenizer import (
    BytesEstimateTokenizer,
    HuggingFaceTokenizer,
    TiktokenTokenizer,
    Tokenizer,
)
from kvgate.admission.tokenizer import ChatTemplate as Template
from kvgate.config.models import BytesTokenizer, ChatTemplate, ReplicaTokenizer
from kvgate.config.models import HuggingFaceTokenizer as HuggingFaceConfig
from kvgate.config.models import TiktokenTokenizer as TiktokenConfig

HAS_TOKENIZERS = importlib.util.find_spec("tokenizers") is not None


def encode(body: dict[str, object], tokenizer: Tokenizer, template: Template) -> list[int]:
    """The ids the gateway counts for ``body``: token ids sent as they are, text encoded."""
    prompt = prompt_of(body, template)
    return prompt if isinstance(prompt, list) else tokenizer.encode(prompt)


def test_default_tokenizer_is_the_offline_tiktoken_encoding() -> None:
    tokenizer = tokenizer_for(TiktokenConfig())
    assert isinstance(tokenizer, TiktokenTokenizer)
    assert tokenizer.count("hello world") == 2


def test_bytes_and_replica_kinds() -> None:
    tokenizer = tokenizer_for(BytesTokenizer(kind="bytes", bytes_per_token=2))
    assert isinstance(tokenizer, BytesEstimateTokenizer) and tokenizer.count("abcde") == 3
    assert tokenizer_for(ReplicaTokenizer(kind="replica")) is None


def test_chat_is_counted_after_the_template() -> None:
    tokenizer = BytesEstimateTokenizer(1)
    template = template_for(
        ChatTemplate(message_prefix="[{role}]", message_suffix="|", generation_prompt="A:")
    )
    body = {
        "messages": [
            {"role": "user", "content": "hi"},
            {"role": "system", "content": [{"type": "text", "text": "x"}]},
        ]
    }
    assert len(encode(body, tokenizer, template)) == len("[user]hi|[system]x|A:")


@pytest.mark.parametrize(
    ("prompt", "expected"),
    [("abcd", 4), (["ab", "cd"], 4), ([1, 2, 3], 3), ([[1, 2], [3]], 3), (None, 0)],
)
def test_completions_prompts(prompt: object, expected: int) -> None:
    ids = encode({"prompt": prompt}, BytesEstimateTokenizer(1), template_for(ChatTemplate()))
    assert len(ids) == expected


def test_hf_without_the_extra_says_how_to_install_it(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    # A None entry in sys.modules makes `import tokenizers` fail as on a machine without the extra.
    monkeypatch.setitem(sys.modules, "tokenizers", None)
    with pytest.raises(ImportError, match=r"kvgate\[hf\]"):
        tokenizer_for(HuggingFaceConfig(kind="huggingface", path=str(tmp_path / "tokenizer.json")))


@pytest.mark.skipif(not HAS_TOKENIZERS, reason="needs the 'hf' extra")
def test_hf_tokenizer_json(tmp_path: Path) -> None:
    path = tmp_path / "tokenizer.json"
    vocab = {"[UNK]": 0, "hello": 1, "world": 2}
    path.write_text(
        json.dumps(
            {
                "version": "1.0",
                "model": {"type": "WordLevel", "vocab": vocab, "unk_token": "[UNK]"},
                "pre_tokenizer": {"type": "Whitespace"},
            }
        )
    )
    tokenizer = HuggingFaceTokenizer.from_file(path)
    assert tokenizer.encode("hello world nope") == [1, 2, 0]
    assert tokenizer.count("hello world") == 2
