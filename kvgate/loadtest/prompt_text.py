"""Prompt text of an exact token length, deterministic in its key.

Prompts are text-like (words from a fixed list) and built to an exact token count on the project's
tokeniser seam, each opening with its own words so unrelated prompts never share a cached prefix by
accident.
"""

from __future__ import annotations

import functools
import random
from collections.abc import Callable

from kvgate.admission.tokenizer import DEFAULT_ENCODING, TiktokenTokenizer, Tokenizer

_WORD_TEXT = (
    "the of and to in is that for it as was with be by on not he this are or his from at which but "
    "have an they you were her she there been one all we their has would when if so no will more can "
    "time about into than them only other new some could these two may first then do any like my now "
    "over such our man me even most made after also did many before must through back years where much "
    "your way well down should because each just those people how too little state good very make world "
    "still own see men work long get here between both life being under never day same another know while "
    "last might us great old year off come since against go came right used take three house himself "
    "few during without again place around however home small found thought went say part once high "
    "general upon school every does got united left number course war until always away something fact "
    "though water less public put think almost hand enough far took head yet government system better set "
    "told nothing night end why called eyes find going look asked later knew point next program city "
    "business give group toward young days let room president side social given present several order "
    "national possible rather second face per among form important often things looked early white case "
    "john become large big need four within felt along children saw best church ever least power "
    "development light thing seemed family interest want members mind country area others done turned "
    "although open problem service certain kind different thus began door help means sense whole matter "
    "perhaps itself york times law human line above name example action company hands local show whether "
    "five history gave today either act feet across taken past quite anything seen having death experience "
    "body word half really field am car words already themselves information tell together college shall "
    "money period held keep sure free real seems behind cannot miss political air question making office "
    "brought whose special heard major problems ago became federal study available known result street "
    "economic boy position reason change south board individual job areas society west close turn love "
    "community true court force full seem am policy voice plan early minutes river market report model "
    "signal token cache replica queue budget latency window memory batch engine request stream"
)
WORDS = tuple(_WORD_TEXT.split())

_HEAD_WORDS = 6


class PromptFactory:
    """Builds text of an exact token length; the same ``(key, length_tokens)`` gives the same text."""

    def __init__(
        self,
        tokenizer: Tokenizer,
        decode: Callable[[list[int]], str],
        corpus_seed: int = 0,
        corpus_words: int = 60_000,
    ) -> None:
        self._tokenizer = tokenizer
        self._decode = decode
        corpus = _sentences(random.Random(f"corpus:{corpus_seed}"), corpus_words)
        self._corpus_tokens = tokenizer.encode(corpus)
        self.text = functools.lru_cache(maxsize=1024)(self._text)

    @classmethod
    def from_encoding(cls, encoding_name: str = DEFAULT_ENCODING) -> PromptFactory:
        """Counts through the tokeniser seam; decodes with the same tiktoken encoding."""
        import tiktoken

        encoding = tiktoken.get_encoding(encoding_name)
        return cls(TiktokenTokenizer.from_name(encoding_name), encoding.decode)

    def _text(self, key: int, length_tokens: int) -> str:
        if length_tokens <= 0:
            return ""
        rng = random.Random(key)
        head = " ".join(rng.choice(WORDS) for _ in range(_HEAD_WORDS)).capitalize() + ":"
        corpus = self._corpus_tokens
        cursor = rng.randrange(len(corpus))
        tokens = self._tokenizer.encode(head)[:length_tokens]
        cursor = self._extend(tokens, cursor, length_tokens - len(tokens))
        text = self._decode(tokens)
        for _ in range(16):
            count = self._tokenizer.count(text)
            if count == length_tokens:
                return text
            if count > length_tokens:
                del tokens[len(tokens) - (count - length_tokens) :]
            else:
                cursor = self._extend(tokens, cursor, length_tokens - count)
            text = self._decode(tokens)
        return _pad_to(self._tokenizer, text, length_tokens)

    def _extend(self, tokens: list[int], cursor: int, count: int) -> int:
        corpus = self._corpus_tokens
        while count > 0:
            take = min(count, len(corpus) - cursor)
            tokens.extend(corpus[cursor : cursor + take])
            count -= take
            cursor = (cursor + take) % len(corpus)
        return cursor


def _pad_to(tokenizer: Tokenizer, text: str, length_tokens: int) -> str:
    """Exact length by whole words when slicing tokens keeps merging across a boundary."""
    while tokenizer.count(text) > length_tokens and text:
        text = text[: text.rfind(" ")] if " " in text else text[:-1]
    while tokenizer.count(text) < length_tokens:
        text += " a"
    return text


def _sentences(rng: random.Random, words: int) -> str:
    parts: list[str] = []
    while words > 0:
        length = rng.randint(6, 18)
        sentence = " ".join(rng.choice(WORDS) for _ in range(length))
        parts.append(sentence.capitalize() + ".")
        words -= length
    return " ".join(parts)


@functools.cache
def default_factory() -> PromptFactory:
    return PromptFactory.from_encoding()
