"""What a per-key limit counter does, and the few facts it hands back.

A counter answers one question per request, "may key K start one more now?", and keeps what the
answer depends on: the requests started over the last minute, the requests running, the tokens of
the requests that ended over the last minute, and the key's totals. Limits are checked and the
request counted in one step, so that two requests of a key racing for its last place never both get
it. Windows slide: an entry counts for :data:`WINDOW_S` seconds after its time, then goes.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Sequence
from dataclasses import dataclass
from enum import StrEnum

from policies.types import Usage

WINDOW_S = 60.0
"""The sliding window of the per-minute limits."""

MAX_REQUEST_S = 900.0
"""How long a running request holds its concurrency place at most. A request is freed when it ends;
this bounds what a request that never says so holds: one on a replica that died mid-request (Redis
keeps its entry), or one whose release was lost. A request running longer than this no longer
counts towards ``concurrent``, so a key may briefly exceed it then."""


class Limit(StrEnum):
    """The limit that refused a request (its name in the config)."""

    REQUESTS_PER_MINUTE = "requests_per_minute"
    CONCURRENT = "concurrent"
    TOKENS_PER_MINUTE = "tokens_per_minute"


@dataclass(frozen=True, slots=True)
class Quota:
    """A key's limits; ``None`` is no limit."""

    requests_per_minute: int | None = None
    concurrent: int | None = None
    tokens_per_minute: int | None = None


@dataclass(frozen=True, slots=True)
class Refusal:
    """Why a request may not start, and in how many seconds it would (the ``retry-after``)."""

    limit: Limit
    wait_s: float


@dataclass(frozen=True, slots=True)
class KeyUsage:
    """A key's counts: what its limits see now, and its totals (requests that ended, their tokens)."""

    running: int = 0
    last_minute_requests: int = 0
    last_minute_tokens: int = 0
    requests: int = 0
    prompt_tokens: int = 0
    cached_tokens: int = 0
    completion_tokens: int = 0


class Counter(ABC):
    """Per-key counts behind :class:`gateway.access.Access`. Keys are known by name."""

    @abstractmethod
    async def admit(self, key: str, quota: Quota, request_id: str) -> Refusal | None:
        """Start ``request_id`` of ``key`` if ``quota`` allows it (``None``), else say why not."""

    @abstractmethod
    async def release(self, key: str, request_id: str, usage: Usage | None) -> None:
        """``request_id`` ended: it runs no more; its tokens count for a minute and in the totals.
        Releasing a request this counter did not admit is harmless: it was not running here, its
        tokens and totals count."""

    @abstractmethod
    async def usage(self, keys: Sequence[str]) -> dict[str, KeyUsage]:
        """The counts of each of ``keys`` (zeros for a key never seen)."""

    async def close(self) -> None:  # noqa: B027 (most counters hold nothing to let go of)
        """Let go of connections, if any."""


def tokens_wait(entries: Sequence[tuple[float, int]], limit: int, now: float) -> float | None:
    """Seconds until the tokens of ``entries`` (time, tokens; oldest first) drop below ``limit`` as
    they leave the window; ``None`` when they already are below it."""
    used = sum(tokens for _, tokens in entries)
    if used < limit:
        return None
    for at, tokens in entries:
        used -= tokens
        if used < limit:
            return at + WINDOW_S - now
    return None  # not reached: with every entry gone, 0 < limit
