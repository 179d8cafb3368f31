"""The huge prompt's shapes: what a client may send, each with its own worst case for counting.

``words`` is prose from a small vocabulary (``bench.tokenize.make_prompt``: about four characters a
token), ``short-words`` random words of one to six letters (one token or two a word, so a megabyte
is far over a 128k window on its word count alone), and ``letters`` one unbroken run of random
letters: a single pre-tokeniser piece that cannot be cut at whitespace, BPE's worst case.
"""

from __future__ import annotations

import random
import string

from bench.tokenize import make_prompt

SHAPES = ("words", "short-words", "letters")


def shaped_prompt(shape: str, size_bytes: int, seed: int = 0) -> str:
    """About ``size_bytes`` of ASCII text of ``shape`` (one of ``SHAPES``)."""
    if shape == "words":
        return make_prompt(size_bytes, seed)
    rng = random.Random(seed)
    letters = rng.choices(string.ascii_lowercase, k=size_bytes)
    if shape == "letters":
        return "".join(letters)
    if shape != "short-words":
        raise ValueError(f"unknown prompt shape {shape!r}; known: {', '.join(SHAPES)}")
    words: list[str] = []
    start = 0
    while start < size_bytes:
        length = rng.randint(1, 6)
        words.append("".join(letters[start : start + length]))
        start += length + 1
    return " ".join(words)
