"""Deterministic prompt text for trace requests: one text per block id, prompts as one user message.

A block of ``n`` tokens is ``n - 1`` words of one to four lowercase letters, each after a space, and a
final newline. Under the simulators' tokenizer (``backends.sim.tokenizer``) a space followed by at most
four letters is exactly one token and a newline is one token, so a block is exactly ``n`` tokens and
the tokens of a concatenation are the concatenation of the blocks' tokens. The words are
``WORDS[b % 64]`` for the bytes ``b`` of ``shake_128(f"block-{id}").digest(n - 1)``: equal ids
give equal text in every process, and the engine models of a virtual-time replay get the same
tokens without tokenizing (``block_tokens``, ``prompt_tokens``).

A request's prompt is its blocks' texts in order, the last one cut to the tokens left
(``input_tokens - block * (len(hash_ids) - 1)``, at least one), sent as ONE user message. A cut block is
a token prefix of the whole block, so a conversation that grows by blocks is a token-prefix extension
of its previous turn: llama.cpp slot reuse and vLLM block reuse both apply.
"""

from __future__ import annotations

import hashlib
from functools import lru_cache
from typing import Any

from backends.sim import tokenizer
from gateway.replay.traces import BLOCK_TOKENS, TraceRequest

# fmt: off
WORDS = (
    "the", "code", "file", "test", "pass", "fail", "run", "load", "save", "line", "diff", "edit", "fix",
    "bug", "call", "tool", "read", "type", "data", "list", "map", "key", "val", "set", "get", "put",
    "add", "drop", "sort", "find", "path", "dir", "mod", "use", "make", "keep", "next", "step", "loop",
    "node", "tree", "leaf", "root", "hash", "slot", "turn", "plan", "goal", "task", "done", "wait",
    "send", "recv", "open", "shut", "int", "str", "byte", "char", "word", "text", "doc", "note", "log",
)
# fmt: on


PIECES = tuple(" " + w for w in WORDS)
PIECE_IDS = tuple(tokenizer.piece_id(p) for p in PIECES)
NEWLINE_ID = tokenizer.piece_id("\n")
BYTE_PIECES = tuple(PIECES[b % len(PIECES)] for b in range(256))
BYTE_IDS = tuple(PIECE_IDS[b % len(PIECE_IDS)] for b in range(256))
"""A random byte's word and token (64 words: every word as likely)."""
CHAT_HEAD = tokenizer.encode(f"{tokenizer.IM_START}user\n")
CHAT_TAIL = tokenizer.encode(f"{tokenizer.IM_END}\n{tokenizer.IM_START}assistant\n")
"""The simulators' chat template around one user message (``backends.sim.chat.render_chat``)."""


@lru_cache(maxsize=8192)
def _draw(block_id: int, tokens: int) -> bytes:
    return hashlib.shake_128(f"block-{block_id}".encode()).digest(max(tokens - 1, 0))


@lru_cache(maxsize=8192)
def block_text(block_id: int, tokens: int = BLOCK_TOKENS) -> str:
    """The text of block ``block_id``: exactly ``tokens`` simulator tokens, ending in a newline."""
    return "".join(map(BYTE_PIECES.__getitem__, _draw(block_id, tokens))) + "\n"


@lru_cache(maxsize=8192)
def block_tokens(block_id: int, tokens: int = BLOCK_TOKENS) -> tuple[int, ...]:
    """The simulator tokens of :func:`block_text` (``tokenizer.encode`` of it, without tokenizing)."""
    return (*map(BYTE_IDS.__getitem__, _draw(block_id, tokens)), NEWLINE_ID)


def prompt_text(request: TraceRequest, block: int = BLOCK_TOKENS) -> str:
    """The prompt of ``request``: its blocks' texts, the last cut to the remaining tokens."""
    ids = request.hash_ids
    if not ids:
        return ""
    parts = [block_text(i, block) for i in ids[:-1]]
    last = max(request.input_tokens - block * (len(ids) - 1), 1)
    tail = block_text(ids[-1], block)
    if last < block:
        tail = _cut(tail, last)
    parts.append(tail)
    return "".join(parts)


def prompt_tokens(request: TraceRequest, block: int = BLOCK_TOKENS) -> list[int]:
    """The tokens a simulated engine sees for :func:`request_messages` of a request without literal
    ``messages``: the chat template around :func:`prompt_text`'s tokens (equal to tokenizing the
    rendered chat, a test checks it)."""
    ids = request.hash_ids
    out = list(CHAT_HEAD)
    if ids:
        for i in ids[:-1]:
            out += block_tokens(i, block)
        last = max(request.input_tokens - block * (len(ids) - 1), 1)
        out += block_tokens(ids[-1], block)[:last]
    out += CHAT_TAIL
    return out


def _cut(text: str, tokens: int) -> str:
    """The first ``tokens`` tokens of a block text (each word piece starts with a space)."""
    pieces = text.split(" ")  # pieces[0] == "" (the text starts with a space)
    return " ".join(pieces[: tokens + 1]).removesuffix("\n")  # all the words: not the newline


def request_messages(request: TraceRequest, block: int = BLOCK_TOKENS) -> list[dict[str, Any]]:
    """The chat messages to send: the literal ``messages`` when given, else one user message."""
    if request.messages is not None:
        return list(request.messages)
    return [{"role": "user", "content": prompt_text(request, block)}]
