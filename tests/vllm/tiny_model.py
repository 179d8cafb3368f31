"""A tiny Llama model directory that real vLLM serves on a CPU in seconds, made here from nothing.

vLLM needs a model directory even with ``--load-format dummy`` (random weights): a ``config.json``
it can build the network from, and a tokenizer with a chat template for the OpenAI routes. This
writes both without downloading anything: a 2-layer ``LlamaForCausalLM`` (hidden 128, 2 heads of
dimension 64, the smallest head vLLM's CPU attention accepts) and a byte-level BPE trained in about
a second by the ``tokenizers`` package on a corpus generated from a fixed seed, so every run writes
the same vocabulary and the same ids. Special tokens come first, so their ids are fixed:
``<unk>`` 0, ``<s>`` 1 (BOS, prepended as Llama does), ``</s>`` 2 (EOS), ``<pad>`` 3, then the
chat markers. The chat template emits the BOS itself (vLLM's chat path adds no special tokens).

Run with an interpreter that has ``tokenizers`` (vLLM's own environment has it):
``python tests/vllm/tiny_model.py OUT_DIR``.
"""

from __future__ import annotations

import json
import random
import sys
from pathlib import Path
from typing import Any

SPECIAL_TOKENS = ("<unk>", "<s>", "</s>", "<pad>", "<|system|>", "<|user|>", "<|assistant|>", "<|end|>")
MAX_POSITION_TOKENS = 4096
HIDDEN_SIZE = 128
LAYERS = 2
HEADS = 2
HEAD_DIM = 64
KV_BYTES_PER_TOKEN = 2 * LAYERS * HEADS * HEAD_DIM * 2
"""K and V, per layer and head, in bfloat16: what kvgate's ``architecture`` section derives too."""

CHAT_TEMPLATE = (
    "{{ bos_token }}"
    "{% for message in messages %}"
    "{% if message['content'] is string %}{% set text = message['content'] %}"
    "{% else %}{% set text = message['content'] | map(attribute='text') | join('') %}{% endif %}"
    "<|{{ message['role'] }}|>\n{{ text }}<|end|>\n"
    "{% endfor %}"
    "{% if add_generation_prompt %}<|assistant|>\n{% endif %}"
)

_NOUNS = (
    "gateway", "replica", "request", "token", "prompt", "cache", "block", "batch", "queue",
    "scheduler", "model", "router",
)  # fmt: skip
_VERBS = (
    "routes", "serves", "counts", "streams", "caches", "evicts", "admits", "queues", "sends",
    "reads", "writes", "keeps",
)  # fmt: skip
_WORDS = (
    "the", "a", "one", "two", "three", "four", "five", "six", "seven", "eight", "nine", "ten",
    "hello", "world", "please", "tell", "me", "story", "about", "what", "is", "time", "quick",
    "brown", "fox", "jumps", "over", "lazy", "dog", "yes", "no", "maybe", "because", "however",
)  # fmt: skip
_SYLLABLES = (
    "ka", "lo", "mi", "ren", "tas", "vo", "qui", "zel", "dor", "fan", "gi", "hup", "jor", "nex",
    "pra", "sul", "tri", "wen", "yot", "bra",
)  # fmt: skip


def corpus(lines: int = 600, seed: int = 0) -> list[str]:
    """English-like sentences plus pseudo-words: enough distinct pairs for a few thousand merges."""
    rng = random.Random(seed)
    pseudo = ["".join(rng.choices(_SYLLABLES, k=rng.randint(1, 4))) for _ in range(2500)]
    text = []
    for _ in range(lines):
        sentence = f"The {rng.choice(_NOUNS)} {rng.choice(_VERBS)} the {rng.choice(_NOUNS)}."
        sentence += " " + " ".join(rng.choices(_WORDS, k=rng.randint(3, 10)))
        sentence += f" {rng.randint(0, 9999)}{rng.choice('!?:;,.')} "
        sentence += " ".join(rng.choices(pseudo, k=rng.randint(4, 14)))
        text.append(sentence)
    return text


def build_tokenizer(vocab_size: int = 4096) -> Any:
    # Imported here: vLLM's environment has ``tokenizers``; the tests that read this module's
    # constants run in kvgate's, which need not.
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, processors, trainers

    tokenizer = Tokenizer(models.BPE(unk_token="<unk>"))
    tokenizer.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tokenizer.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size,
        special_tokens=list(SPECIAL_TOKENS),
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        min_frequency=1,
        show_progress=False,
    )
    tokenizer.train_from_iterator(corpus(), trainer=trainer)
    bos = tokenizer.token_to_id("<s>")
    tokenizer.post_processor = processors.TemplateProcessing(
        single="<s> $A", pair="<s> $A <s> $B", special_tokens=[("<s>", bos)]
    )
    return tokenizer


def write_model(out_dir: Path) -> int:
    """Write the model directory; returns the vocabulary size (``config.json``'s ``vocab_size``)."""
    out_dir.mkdir(parents=True, exist_ok=True)
    tokenizer = build_tokenizer()
    tokenizer.save(str(out_dir / "tokenizer.json"))
    ids = {token: tokenizer.token_to_id(token) for token in SPECIAL_TOKENS}
    if [ids[token] for token in SPECIAL_TOKENS] != list(range(len(SPECIAL_TOKENS))):
        raise RuntimeError(f"special tokens did not get the first ids: {ids}")
    vocab_size = int(tokenizer.get_vocab_size(with_added_tokens=True))
    special = {"bos_token_id": ids["<s>"], "eos_token_id": ids["</s>"], "pad_token_id": ids["<pad>"]}
    config = {
        "architectures": ["LlamaForCausalLM"],
        "model_type": "llama",
        "hidden_size": HIDDEN_SIZE,
        "intermediate_size": 2 * HIDDEN_SIZE,
        "num_hidden_layers": LAYERS,
        "num_attention_heads": HEADS,
        "num_key_value_heads": HEADS,
        "head_dim": HEAD_DIM,
        "hidden_act": "silu",
        "max_position_embeddings": MAX_POSITION_TOKENS,
        "rms_norm_eps": 1e-5,
        "rope_theta": 10000.0,
        "tie_word_embeddings": False,
        "torch_dtype": "bfloat16",
        "vocab_size": vocab_size,
        **special,
    }
    names = {"bos_token": "<s>", "eos_token": "</s>", "unk_token": "<unk>", "pad_token": "<pad>"}
    tokenizer_config = {
        "tokenizer_class": "PreTrainedTokenizerFast",
        **names,
        "add_bos_token": True,
        "add_eos_token": False,
        "clean_up_tokenization_spaces": False,
        "model_max_length": MAX_POSITION_TOKENS,
        "additional_special_tokens": list(SPECIAL_TOKENS[4:]),
        "chat_template": CHAT_TEMPLATE,
    }
    files = {
        "config.json": config,
        "generation_config.json": special,
        "tokenizer_config.json": tokenizer_config,
        "special_tokens_map.json": names,
    }
    for name, content in files.items():
        (out_dir / name).write_text(json.dumps(content, indent=2) + "\n")
    return vocab_size


if __name__ == "__main__":
    if len(sys.argv) != 2:
        sys.exit("usage: tiny_model.py OUT_DIR")
    print(write_model(Path(sys.argv[1])))
