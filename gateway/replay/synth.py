"""Deterministic prompt text for trace requests: one text per block id, prompts as one user message.

A block of ``n`` tokens is ``n - 1`` words of one to four lowercase letters, each after a space, and a
final newline. Under the simulators' tokenizer (``backends.sim.tokenizer``) a space followed by at most
four letters is exactly one token and a newline is one token, so a block is exactly ``n`` tokens and
the tokens of a concatenation are the concatenation of the blocks' tokens. The words come from
``random.Random(f"block-{id}")``: equal ids give equal text in every process.

A request's prompt is its blocks' texts in order, the last one cut to the tokens left
(``input_tokens - block * (len(hash_ids) - 1)``, at least one), sent as ONE user message. A cut block is
a token prefix of the whole block, so a conversation that grows by blocks is a token-prefix extension
of its previous turn: llama.cpp slot reuse and vLLM block reuse both apply.
"""

from __future__ import annotations

import random
from functools import lru_cache
from typing import Any

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


@lru_cache(maxsize=8192)
def block_text(block_id: int, tokens: int = BLOCK_TOKENS) -> str:
    """The text of block ``block_id``: exactly ``tokens`` simulator tokens, ending in a newline."""
    rng = random.Random(f"block-{block_id}")
    words = rng.choices(WORDS, k=max(tokens - 1, 0))
    return "".join(" " + w for w in words) + "\n"


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


def _cut(text: str, tokens: int) -> str:
    """The first ``tokens`` tokens of a block text (each word piece starts with a space)."""
    pieces = text.split(" ")  # pieces[0] == "" (the text starts with a space)
    return " ".join(pieces[: tokens + 1])


def request_messages(request: TraceRequest, block: int = BLOCK_TOKENS) -> list[dict[str, Any]]:
    """The chat messages to send: the literal ``messages`` when given, else one user message."""
    if request.messages is not None:
        return list(request.messages)
    return [{"role": "user", "content": prompt_text(request, block)}]
