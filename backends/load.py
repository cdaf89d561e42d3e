"""What a backend holds of turnout's requests, in two summaries: ``Load``, a replica's word to the
others (``gateway.replicas``), and ``Own``, this replica's count (``backends.inflight.InFlight.own``).
"""

from __future__ import annotations

from typing import NamedTuple

import msgspec


class Load(msgspec.Struct, frozen=True):
    """Requests in flight on one backend, as another replica sees them: their prefill backlog (what
    the engines cannot report) and how many."""

    backlog_s: float = 0.0
    running: int = 0
    at: float = 0.0
    """When it was measured (wall clock; 0: now): the engine works the backlog off meanwhile."""

    def backlog_at(self, now: float) -> float:
        """The backlog left at ``now``: the prefill predicted when measured, less the time since. A
        replica's word is up to a second old; its request may have long passed its prompt."""
        return max(0.0, self.backlog_s - max(0.0, now - self.at)) if self.at else self.backlog_s

    def __add__(self, other: Load) -> Load:
        at = max(self.at, other.at)  # both as of the later measurement
        return Load(self.backlog_at(at) + other.backlog_at(at), self.running + other.running, at)


class Own(NamedTuple):
    """Turnout's own requests open on one backend."""

    requests: int
    tokens: int
    """Their prompt tokens."""
    prefilling: int
    """The prompt tokens of those without a first token yet."""


NONE_OWN = Own(0, 0, 0)
