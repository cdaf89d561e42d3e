"""Which sessions are live: the ones that sent a turn lately, counted per gateway process.

Routing weighs a new slot pin by the chance it lasts (``policies.slots.keep_chance``), which needs
how many sessions compete for the slots. A session counts from its turn until ``window`` seconds of
silence; the count is this process's (replicas on one Redis each count what they route).
"""

from __future__ import annotations

MAX_TRACKED = 100_000
"""A bound on the bookkeeping (a dict entry per session): beyond it the longest silent go first."""


class LiveSessions:
    """Sessions by last turn, oldest first: touching one moves it to the end, counting drops the
    expired ones from the front (amortised O(1) per request)."""

    def __init__(self, window: float, max_tracked: int = MAX_TRACKED) -> None:
        self.window = window
        self.max_tracked = max_tracked
        self._seen: dict[str, float] = {}

    def touch(self, key: str, now: float) -> None:
        self._seen.pop(key, None)
        self._seen[key] = now
        if len(self._seen) > self.max_tracked:
            del self._seen[next(iter(self._seen))]

    def count(self, now: float) -> int:
        """Sessions live at ``now``."""
        horizon = now - self.window
        while self._seen:
            oldest = next(iter(self._seen))
            if self._seen[oldest] >= horizon:
                break
            del self._seen[oldest]
        return len(self._seen)


FOLLOW_WINDOW = 100
"""First turns the follow-up rate remembers (exponentially: older ones weigh less)."""


class FollowUps:
    """How often a conversation known only by its content (no session id) comes back after its
    first turn: agents do, one-off requests do not. Routing lets a first turn look ahead by this
    chance while a llama.cpp slot is free (``policies.context.RoutingContext.follow_rate``).

    Counts decay by ``1 - 1 / window`` per first turn, so the rate follows the traffic of the last
    ``window`` or so; it starts at 1/2 (one imagined follow-up in two first turns)."""

    def __init__(self, window: int = FOLLOW_WINDOW) -> None:
        self._decay = 1.0 - 1.0 / window
        self._first = 0.0
        self._followed = 0.0

    def first_turn(self) -> None:
        self._first = self._first * self._decay + 1.0
        self._followed *= self._decay

    def second_turn(self) -> None:
        self._followed = min(self._followed + 1.0, self._first)

    @property
    def rate(self) -> float:
        return (self._followed + 1.0) / (self._first + 2.0)
