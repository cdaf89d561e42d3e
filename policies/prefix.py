"""Prompts as content-addressed chains: what the gateway can know of an engine's prefix caches.

A prompt is rendered into canonical bytes in the order an engine's chat template renders it (tool
list, then each message: role, text, tool calls, tool call id) and cut into ``CHUNK_BYTES`` chunks.
Hashes chain: ``hashes[i]`` is the BLAKE2b digest (64 bits) of all bytes up to the end of chunk
``i``, so equal hashes mean equal prefixes, and a prompt that extends another shares every full
chunk of it. ``whole`` is the digest of every byte.

Separators come *before* each message and empty fields add nothing, so a conversation that grows
by new messages, or by text appended to its last message (Mooncake-style traces, a completion
prompt), keeps its previous rendering as an exact byte prefix; :meth:`PromptChain.extends` checks
that without keeping anyone's text.

Nothing here stores text: the gateway's index (``gateway.state``) keeps the hashes and token counts
of what it sent where.
"""

from __future__ import annotations

import hashlib
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import msgspec

CHUNK_BYTES = 1024
"""Bytes per chunk (about 280 tokens of English or code)."""
FAMILY_CHUNKS = 4
"""The chunks that make a prompt's family (4 KB: the tool list and the start of the system prompt, the
same on every request of one agent harness and, in the routing benchmark's contention rows, of every
agent; a one-off prompt's own text elsewhere): ``gateway.live.FollowUps`` learns per family how often a
first turn comes back. The contention rows without session ids gave the same result for 1, 2, 4, 8
and 16 chunks (docs/benchmarks.md, 2026-12-05, ninth session)."""
HASH_BYTES = 8


def part_text(part: Mapping[str, Any]) -> str:
    """Text of one content block: OpenAI parts, Anthropic text/tool_use/tool_result, Responses items."""
    if part.get("type") == "tool_use":
        return f"{part.get('name', '')}({part.get('input', '')})"
    for key in ("text", "content", "output", "arguments"):
        value = part.get(key)
        if value is not None:
            return value if isinstance(value, str) else message_text(value)
    return ""


def message_text(content: Any) -> str:
    """The text of a message's content: a string, or its blocks' texts joined by newlines."""
    if isinstance(content, str):
        return content
    if isinstance(content, list):
        parts = []
        for part in content:
            if isinstance(part, Mapping):
                parts.append(part_text(part))
            elif isinstance(part, str):
                parts.append(part)
        return "\n".join(parts)
    return ""


def tool_calls_text(message: Mapping[str, Any]) -> str:
    """A message's tool calls as ``render`` puts them: ``name(arguments)``, joined by ``;``."""
    calls = message.get("tool_calls")
    if not isinstance(calls, list):
        return ""
    out = []
    for call in calls:
        function = call.get("function") if isinstance(call, Mapping) else None
        if isinstance(function, Mapping):
            out.append(f"{function.get('name', '')}({function.get('arguments', '')})")
    return ";".join(out)


def _tools(tools: Any) -> str:
    if not isinstance(tools, list):
        return ""
    names = []
    for tool in tools:
        function = tool.get("function", tool) if isinstance(tool, Mapping) else None
        if isinstance(function, Mapping):
            fields = (function.get(k, "") for k in ("name", "description", "parameters"))
            names.append(":".join(str(f) for f in fields))
    return "\n".join(names)


MESSAGE_MARK = b"\x1e"
"""Where a message starts in :func:`render`'s bytes."""


def render(messages: Iterable[Any], tools: Any = None) -> bytes:
    """The canonical bytes of a conversation (module docstring)."""
    parts = [_tools(tools)]
    for message in messages:
        if not isinstance(message, Mapping):
            continue
        parts.append(
            f"{MESSAGE_MARK.decode()}{message.get('role', '')}\x1f{message_text(message.get('content'))}"
        )
        if calls := tool_calls_text(message):
            parts.append(f"\x1d{calls}")
        if call_id := message.get("tool_call_id"):
            parts.append(f"\x1c{call_id}")
    return "".join(parts).encode("utf-8", "replace")


def render_completion(prompt: Any) -> bytes:
    """The canonical bytes of a text-completion prompt (a string or strings; token ids as text)."""
    if isinstance(prompt, str):
        return prompt.encode("utf-8", "replace")
    if isinstance(prompt, Sequence):
        return "".join(p if isinstance(p, str) else f"{p} " for p in prompt).encode("utf-8", "replace")
    return b""


def _digest(data: bytes | memoryview) -> int:
    return int.from_bytes(hashlib.blake2b(data, digest_size=HASH_BYTES).digest(), "big")


class PromptMark(msgspec.Struct, frozen=True):
    """A prompt known by its hashes alone: its length in bytes, its last full chunk, its whole digest."""

    length: int
    last_chunk: int | None
    whole: int


@dataclass(frozen=True, slots=True)
class PromptChain:
    """A prompt's chained chunk hashes (module docstring). ``stream`` stays in the request's memory."""

    hashes: tuple[int, ...]
    length: int
    whole: int
    stream: bytes = field(default=b"", repr=False, compare=False)
    _prefix_digests: dict[int, int] = field(default_factory=dict, init=False, repr=False, compare=False)
    """Digests of prefixes already computed: routing one request compares the same previous prompt
    (the session's tip, its slot, the recent prompts) several times, each a hash of up to the whole prompt."""

    @property
    def chunks(self) -> int:
        return len(self.hashes)

    @property
    def family(self) -> int | None:
        """The prompt's family (``FAMILY_CHUNKS``): the hash of its first chunks, the whole prompt's
        full chunks when it is shorter; None under one chunk."""
        return self.hashes[min(FAMILY_CHUNKS, len(self.hashes)) - 1] if self.hashes else None

    def prefix_digest(self, length: int) -> int | None:
        """The digest of this prompt's first ``length`` bytes (None when it is shorter)."""
        if length > self.length:
            return None
        if length == self.length:
            return self.whole
        digest = self._prefix_digests.get(length)
        if digest is None:
            digest = self._prefix_digests[length] = _digest(memoryview(self.stream)[:length])
        return digest

    @property
    def mark(self) -> PromptMark:
        return PromptMark(self.length, self.hashes[-1] if self.hashes else None, self.whole)

    def mark_at(self, length: int) -> PromptMark | None:
        """The mark of this prompt's first ``length`` bytes (None when it is shorter, or has no bytes)."""
        digest = self.prefix_digest(length) if self.stream or length == self.length else None
        if digest is None:
            return None
        chunks = length // CHUNK_BYTES
        return PromptMark(length, self.hashes[chunks - 1] if chunks else None, digest)

    def extends(self, other: PromptMark) -> bool:
        """Whether a previous prompt, known by its mark, is a byte prefix of this one.

        Its last full chunk must be this prompt's chunk at the same place (chained hashes make
        every earlier chunk equal too), and the digest of this prompt cut to its length its digest.
        A chain without its bytes (one another replica recorded) can only compare whole chunks: the
        bytes after the last one are taken to match.
        """
        chunks = other.length // CHUNK_BYTES
        if other.length > self.length:
            return False
        if chunks and (chunks > self.chunks or self.hashes[chunks - 1] != other.last_chunk):
            return False
        if not self.stream:  # known by its hashes only (another replica's record): whole chunks
            return other.length < self.length or other.whole == self.whole
        return self.prefix_digest(other.length) == other.whole

    def common(self, other: tuple[int, ...]) -> int:
        """Chunks this prompt shares with another prompt's chain: a chained hash encodes every byte
        before it, so chains agree up to some index and differ after it (a binary search, no set)."""
        low, high = 0, min(self.chunks, len(other))
        while low < high:
            mid = (low + high + 1) // 2
            if self.hashes[mid - 1] == other[mid - 1]:
                low = mid
            else:
                high = mid - 1
        return low

    def matched(self, held: frozenset[int] | set[int] | Mapping[int, Any]) -> int:
        """Chunks of this prompt's longest prefix in ``held`` (a binary search: chains are prefix-closed)."""
        low, high = 0, self.chunks
        while low < high:
            mid = (low + high + 1) // 2
            if self.hashes[mid - 1] in held:
                low = mid
            else:
                high = mid - 1
        return low


def chain_of(stream: bytes, chunk: int = CHUNK_BYTES) -> PromptChain:
    """The :class:`PromptChain` of canonical bytes."""
    digest = hashlib.blake2b(digest_size=HASH_BYTES)
    hashes = []
    full = len(stream) - len(stream) % chunk
    view = memoryview(stream)
    for start in range(0, full, chunk):
        digest.update(view[start : start + chunk])
        hashes.append(int.from_bytes(digest.copy().digest(), "big"))
    digest.update(view[full:])
    return PromptChain(tuple(hashes), len(stream), int.from_bytes(digest.digest(), "big"), stream)


EMPTY_CHAIN = chain_of(b"")
