"""A conversation's shape: per-message digests, to say where a prompt stopped extending the last one.

When a turn reuses less of an engine's cache than its previous prompt, the first question is whether
the prompt itself changed: an earlier message edited or dropped, the tool list changed, an
assistant turn's reasoning stripped (a chat template that drops ``reasoning_content`` from history
re-renders every later token). :func:`shape_of` keeps, per message, its role, length, a digest and
the chained digests of its ``PIECE_CHARS``-character pieces (no text); :func:`where_it_breaks`
compares two shapes and names the first message that differs and the character offset inside it,
to within one piece.
"""

from __future__ import annotations

import zlib
from collections.abc import Iterable, Mapping
from typing import Any

import msgspec

from policies.prefix import message_text, render, tool_calls_text

PIECE_CHARS = 1024
"""Offsets are found to within this many characters (a smaller piece costs more memory per session)."""


DIGESTS = 2
"""How the digests are made (kept with every shape): 1 was BLAKE2b; 2 is CRC-32, chained. Shapes made
differently cannot be compared (``where_it_breaks`` says nothing rather than a false break)."""


def _digest(data: bytes, previous: int = 0) -> int:
    """32 bits: these only compare a message with its own previous rendering (a collision would hide one
    break from the diagnostics, never misroute), and they are kept per message of every live session.
    CRC-32 rather than a cryptographic hash: a 60k-token prompt is hashed in ~100 pieces on every
    request (BLAKE2b made the shape 2/3 of the features' CPU), and ``zlib.crc32(data, previous)``
    chains by itself: the CRC of everything hashed so far."""
    return zlib.crc32(data, previous)


class MessageMark(msgspec.Struct, frozen=True):
    role: str
    chars: int
    digest: int
    pieces: tuple[int, ...]  # chained digests of each PIECE_CHARS-character piece
    reasoning: bool = False  # the message carried reasoning (``reasoning_content``, thinking blocks)


class PromptShape(msgspec.Struct, frozen=True):
    tools: int
    messages: tuple[MessageMark, ...]
    digests: int = DIGESTS  # how they were made (``DIGESTS``)


class Break(msgspec.Struct, frozen=True):
    """Where a prompt stopped extending the previous one.

    ``kind``: ``tools-changed``, ``edited``, ``dropped`` (a message of the previous prompt is gone),
    ``reasoning-stripped`` (an assistant message lost its reasoning). ``message``: index in the
    previous prompt; ``offset``: the first character that differs, to within ``PIECE_CHARS``.
    """

    kind: str
    message: int | None
    role: str | None
    offset: int


def _reasoning(message: Mapping[str, Any]) -> str:
    """The reasoning a message carries: ``reasoning_content``/``reasoning``, or thinking blocks."""
    for key in ("reasoning_content", "reasoning"):
        if isinstance(message.get(key), str) and message[key]:
            return str(message[key])
    content = message.get("content")
    if not isinstance(content, list):
        return ""
    return "\n".join(
        str(part.get("thinking") or part.get("text") or "")
        for part in content
        if isinstance(part, Mapping) and part.get("type") in ("thinking", "reasoning")
    )


def _mark(message: Mapping[str, Any]) -> MessageMark:
    """The text is hashed once: its pieces' chain, continued over the rest of what the engine may
    render of the message (role, tool calls, tool call id, reasoning), is the message's digest."""
    reasoning = _reasoning(message)
    content = message.get("content")
    text = content if isinstance(content, str) else message_text(content)
    pieces: list[int] = []
    digest = 0
    for start in range(0, len(text), PIECE_CHARS):
        digest = _digest(text[start : start + PIECE_CHARS].encode("utf-8", "replace"), digest)
        pieces.append(digest)
    role = str(message.get("role", ""))
    rest = f"\x1e{role}\x1d{tool_calls_text(message)}\x1c{message.get('tool_call_id') or ''}\x1f{reasoning}"
    return MessageMark(
        role, len(text), _digest(rest.encode("utf-8", "replace"), digest), tuple(pieces), bool(reasoning)
    )


def shape_of(messages: Iterable[Any], tools: Any = None) -> PromptShape:
    return PromptShape(
        tools=_digest(render([], tools)),
        messages=tuple(_mark(m) for m in messages if isinstance(m, Mapping)),
    )


def _offset(before: MessageMark, after: MessageMark) -> int:
    for index, (a, b) in enumerate(zip(before.pieces, after.pieces, strict=False)):
        if a != b:
            return index * PIECE_CHARS
    return min(before.chars, after.chars)


def where_it_breaks(previous: PromptShape, current: PromptShape) -> Break | None:
    """The first place ``current`` stops extending ``previous``; None when it extends it whole (or when
    the two were digested differently: a session last seen by an older turnout)."""
    if previous.digests != current.digests:
        return None
    if previous.tools != current.tools:
        return Break("tools-changed", None, None, 0)
    now = current.messages
    for index, before in enumerate(previous.messages):
        if index >= len(now):
            return Break("dropped", index, before.role, 0)
        after = now[index]
        if before.digest == after.digest:
            continue
        if index + 1 < len(previous.messages) and previous.messages[index + 1].digest == after.digest:
            return Break("dropped", index, before.role, 0)
        if before.role == after.role == "assistant" and before.reasoning and not after.reasoning:
            return Break("reasoning-stripped", index, before.role, _offset(before, after))
        return Break("edited", index, before.role, _offset(before, after))
    return None
