"""A deterministic toy tokenizer shared by both simulators.

Text is cut into pieces by one regular expression, tried left to right:

* the ChatML special tokens ``<|im_start|>``, ``<|im_end|>`` and ``<|endoftext|>`` (one id each);
* an optional leading space followed by at most 4 letters (``" hello"`` -> ``" hell"``, ``"o"``);
* an optional leading space followed by at most 3 digits;
* an optional leading space followed by one punctuation character;
* any single other character (whitespace, newline, ...).

A piece's id is ``FIRST_ID + crc32(piece) mod (N_VOCAB - FIRST_ID - 3)``, so ids are stable across runs and
processes. English prose comes out at roughly 3.5-4 characters per token. Tokenizing a concatenation
gives the concatenation of the pieces whenever the cut falls on a piece boundary (a newline or a special
token always is one), which keeps chat prompts prefix-stable across turns.
"""

from __future__ import annotations

import re
import zlib
from functools import lru_cache

IM_START = "<|im_start|>"
IM_END = "<|im_end|>"
END_OF_TEXT = "<|endoftext|>"

N_VOCAB = 151936
FIRST_ID = 256
SPECIAL_IDS: dict[str, int] = {END_OF_TEXT: 151643, IM_START: 151644, IM_END: 151645}
EOS_ID = SPECIAL_IDS[IM_END]

_PIECE = re.compile(
    r"<\|im_start\|>|<\|im_end\|>|<\|endoftext\|>| ?[^\W\d_]{1,4}| ?\d{1,3}| ?[^\s\w]|.",
    re.DOTALL,
)
_ORDINARY_RANGE = min(SPECIAL_IDS.values()) - FIRST_ID


def pieces(text: str) -> list[str]:
    """Cut ``text`` into token pieces (see the module docstring); ``"".join(pieces(t)) == t``."""
    return _PIECE.findall(text)


@lru_cache(maxsize=65536)
def piece_id(piece: str) -> int:
    """The id of one piece: a special token's fixed id, else a stable hash of its UTF-8 bytes."""
    special = SPECIAL_IDS.get(piece)
    if special is not None:
        return special
    return FIRST_ID + zlib.crc32(piece.encode("utf-8")) % _ORDINARY_RANGE


def encode(text: str) -> list[int]:
    """Token ids of ``text``; special tokens are always parsed."""
    return [piece_id(p) for p in _PIECE.findall(text)]


def count(text: str) -> int:
    """Number of tokens in ``text`` (``len(encode(text))``)."""
    return len(_PIECE.findall(text))


class Tokenizer:
    """The tokenizer as an object, for code that wants one passed in (``engine.tokenizer``)."""

    n_vocab = N_VOCAB
    eos_id = EOS_ID

    def encode(self, text: str) -> list[int]:
        """Token ids of ``text``."""
        return encode(text)

    def count(self, text: str) -> int:
        """Number of tokens in ``text``."""
        return count(text)

    def pieces(self, text: str) -> list[str]:
        """The pieces behind :meth:`encode`."""
        return pieces(text)
