"""Deterministic prompt text for trace requests: one text per block id, a conversation's turns as a
chat client sends them.

A block of ``n`` tokens is ``n - 1`` words of one to four lowercase letters, each after a space, and a
final newline. Under the simulators' tokenizer (``backends.sim.tokenizer``) a space followed by at most
four letters is exactly one token and a newline is one token, so a block is exactly ``n`` tokens and
the tokens of a concatenation are the concatenation of the blocks' tokens. The words are
``WORDS[b % 64]`` for the bytes ``b`` of ``shake_128(f"block-{id}").digest(n - 1)``: equal ids
give equal text in every process, and the engine models of a virtual-time replay get the same
tokens without tokenizing (``block_tokens``, ``prompt_tokens``).

A request's text is its blocks' texts in order, the last one cut to the tokens left
(``input_tokens - block * (len(hash_ids) - 1)``, at least one). A cut block is a token prefix of the
whole block, so a conversation that grows by blocks is a token-prefix extension of its previous turn.
Alone, the text is ONE user message. In a conversation (``threaded``) a turn that goes on from the
previous one is sent as a chat client sends it: the previous turn's messages, the previous answer as an
assistant message, and the rest as a user message (``TraceRequest.splits``). Its prompt then extends
the previous prompt, generation prompt included, as a real agent's does: llama.cpp resumes a hybrid
slot from the checkpoint 4 tokens before the previous prompt's end, and vLLM reuses its blocks. Sent as
one growing user message instead, every turn diverged inside the previous prompt's template tail and a
hybrid slot went back to the checkpoint a micro-batch before it (``policies.checkpoints``).
"""

from __future__ import annotations

import hashlib
import itertools
from collections.abc import Iterator, Sequence
from dataclasses import replace
from functools import lru_cache
from typing import Any

from backends.sim import tokenizer
from gateway.replay.traces import BLOCK_TOKENS, TraceRequest, conversations

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
ROLES = ("user", "assistant")
"""The roles of a threaded prompt's messages, in turn (``TraceRequest.splits``)."""
HEADS = {role: tokenizer.encode(f"{tokenizer.IM_START}{role}\n") for role in ROLES}
CLOSE = tokenizer.encode(f"{tokenizer.IM_END}\n")
"""The simulators' chat template (``backends.sim.chat.render_chat``): each message's head and close."""
CHAT_HEAD = HEADS["user"]
CHAT_TAIL = CLOSE + HEADS["assistant"]
"""The template around one user message: its head, then its close and the generation prompt."""


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


def text_tokens(request: TraceRequest, block: int = BLOCK_TOKENS) -> int:
    """How many tokens :func:`prompt_text` has: ``input_tokens`` when the ids fit it."""
    ids = request.hash_ids
    if not ids:
        return 0
    return block * (len(ids) - 1) + min(_last(request, block), block)


def _last(request: TraceRequest, block: int) -> int:
    return max(request.input_tokens - block * (len(request.hash_ids) - 1), 1)


def _pieces(request: TraceRequest, block: int) -> Iterator[str]:
    ids = request.hash_ids
    for i in ids[:-1]:
        yield from map(BYTE_PIECES.__getitem__, _draw(i, block))
        yield "\n"
    last = (*map(BYTE_PIECES.__getitem__, _draw(ids[-1], block)), "\n")
    yield from last[: _last(request, block)]


def _bounds(request: TraceRequest, total: int) -> list[tuple[str, int, int]]:
    """Each message's role and token range of the text (``TraceRequest.splits``)."""
    edges = (0, *request.splits, total)
    return [(ROLES[k % 2], a, b) for k, (a, b) in enumerate(itertools.pairwise(edges))]


def prompt_text(request: TraceRequest, block: int = BLOCK_TOKENS) -> str:
    """The text of ``request``: its blocks' texts, the last cut to the remaining tokens."""
    if not request.hash_ids:
        return ""
    return "".join(_pieces(request, block))


def prompt_tokens(request: TraceRequest, block: int = BLOCK_TOKENS) -> list[int]:
    """The tokens a simulated engine sees for :func:`request_messages` of a request without literal
    ``messages``: the chat template around each message of :func:`prompt_text`'s tokens (equal to
    tokenizing the rendered chat, a test checks it)."""
    ids = request.hash_ids
    text: list[int] = []
    if ids:
        for i in ids[:-1]:
            text += block_tokens(i, block)
        text += block_tokens(ids[-1], block)[: _last(request, block)]
    out: list[int] = []
    for role, a, b in _bounds(request, len(text)):
        out += HEADS[role]
        out += text[a:b]
        out += CLOSE
    out += HEADS["assistant"]
    return out


def template_tokens(request: TraceRequest) -> int:
    """The tokens :func:`prompt_tokens` adds to the text: each message's head and close, and the
    generation prompt."""
    messages = len(request.splits) + 1
    assistants = messages // 2
    return (
        (messages - assistants) * len(HEADS["user"])
        + assistants * len(HEADS["assistant"])
        + messages * len(CLOSE)
        + len(HEADS["assistant"])
    )


def user_starts(request: TraceRequest) -> tuple[int, int]:
    """Where the prompt's last and first user messages start in :func:`prompt_tokens` (-1: none), as
    the simulators find them in the rendered chat (``backends.sim.requests.user_starts``: the one at
    position 0 is none)."""
    starts, at = [], 0
    for k, (a, b) in enumerate(itertools.pairwise((0, *request.splits))):
        at += len(HEADS[ROLES[k % 2]]) + b - a + len(CLOSE)
        if k % 2:  # an assistant message ended: a user message starts
            starts.append(at)
    return (starts[-1], starts[0]) if starts else (-1, -1)


def request_messages(request: TraceRequest, block: int = BLOCK_TOKENS) -> list[dict[str, Any]]:
    """The chat messages to send: the literal ``messages`` when given, else the text's messages (one
    user message unless ``splits`` says more)."""
    if request.messages is not None:
        return list(request.messages)
    if not request.splits:
        return [{"role": "user", "content": prompt_text(request, block)}]
    pieces = list(_pieces(request, block)) if request.hash_ids else []
    return [{"role": role, "content": "".join(pieces[a:b])} for role, a, b in _bounds(request, len(pieces))]


def threaded(requests: Sequence[TraceRequest], block: int = BLOCK_TOKENS) -> list[TraceRequest]:
    """``requests`` with each conversation's turns as a chat client sends them (module docstring;
    conversations as the replay paces them, ``traces.conversations``). A turn whose text starts with
    all of the previous turn's and is at least two tokens longer goes on from it: it gets the
    previous turn's ``splits``, then the previous text's end and the end of the previous answer (the
    next ``max_tokens`` tokens of its text, leaving the new user message one token at least). A turn
    that shares the previous one's text up to its last user message, and has some of its own after
    that (a repeat, a rewritten or barely grown last message), resends the previous turn's messages
    (its ``splits``). Any other turn is one user message. Requests with literal ``messages`` are left
    as they are."""
    out = list(requests)
    for chain in conversations(requests):
        for before, after in itertools.pairwise(chain):
            previous, turn = out[before], out[after]
            if previous.messages is not None or turn.messages is not None:
                continue
            end, length = text_tokens(previous, block), text_tokens(turn, block)
            shared = _shared_text(previous, turn, block)
            if shared == end and length - end >= 2:
                answer = min(previous.max_tokens, length - end - 1)
                out[after] = replace(turn, splits=(*previous.splits, end, end + answer))
            elif previous.splits and shared >= previous.splits[-1] and length > previous.splits[-1]:
                out[after] = replace(turn, splits=previous.splits)
    return out


def _shared_text(a: TraceRequest, b: TraceRequest, block: int) -> int:
    """The tokens both texts start with: their equal leading blocks, the last of them as far as both
    reach (a cut block is a token prefix of the whole one)."""
    equal = 0
    for x, y in zip(a.hash_ids, b.hash_ids, strict=False):
        if x != y:
            break
        equal += 1
    return min(text_tokens(a, block), text_tokens(b, block), equal * block)
