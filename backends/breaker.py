"""Circuit breaking: a backend that keeps failing is taken out for a cool-down, then tried once.

Probes say whether an engine answers; a breaker says whether its answers are any good. An engine
can pass every probe and still fail every request (out of memory at each prefill, a broken model
file behind a healthy server, a proxy in front of it answering 502). Per backend:

    closed ──THRESHOLD failures in a row──▶ open ──cool-down──▶ half-open ──its one request──┐
      ▲                                      ▲                                              │
      └──────────────── succeeded ──────────────────────────────────── failed (cool-down x2) ┘

Open, the backend gets no requests (routing rejects it: ``circuit-open``); half-open, it gets one
(the trial) and the others go elsewhere until it ends. The cool-down starts at ``COOL_DOWN_S`` and
doubles with each failed trial up to ``MAX_COOL_DOWN_S``; a success closes the circuit and resets it.
Failures are the engine's: unreachable or hung, a 5xx, a stream that broke off or stalled; never a
request's own fault (a 4xx, a prompt too long, a client that left).
"""

from __future__ import annotations

import time
from collections.abc import Callable
from enum import StrEnum

THRESHOLD = 3
COOL_DOWN_S = 5.0
MAX_COOL_DOWN_S = 60.0


class Circuit(StrEnum):
    CLOSED = "closed"
    OPEN = "open"
    HALF_OPEN = "half-open"


class Breaker:
    def __init__(
        self,
        threshold: int = THRESHOLD,
        cool_down_s: float = COOL_DOWN_S,
        max_cool_down_s: float = MAX_COOL_DOWN_S,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.threshold = threshold
        self.first_cool_down_s = cool_down_s
        self.max_cool_down_s = max_cool_down_s
        self.clock = clock
        self.failures = 0
        self.cool_down_s = cool_down_s
        self.open_until: float | None = None
        self.trial = False  # the half-open circuit's one request is in flight
        self.trips = 0
        self.last_error: str | None = None

    @property
    def state(self) -> Circuit:
        if self.open_until is None:
            return Circuit.CLOSED
        return Circuit.OPEN if self.clock() < self.open_until else Circuit.HALF_OPEN

    def allows(self) -> bool:
        """Whether a request may be sent now (half-open: only while no trial is in flight)."""
        state = self.state
        return state is Circuit.CLOSED or (state is Circuit.HALF_OPEN and not self.trial)

    def sent(self) -> None:
        if self.state is Circuit.HALF_OPEN:
            self.trial = True

    def succeeded(self) -> None:
        self.failures, self.open_until, self.trial = 0, None, False
        self.cool_down_s = self.first_cool_down_s

    def failed(self, error: str) -> bool:
        """Count a failure; True when it opened the circuit."""
        self.last_error = error
        if self.state is Circuit.HALF_OPEN and self.trial:  # the trial failed: wait longer
            self.cool_down_s = min(self.cool_down_s * 2, self.max_cool_down_s)
            return self._open()
        self.failures += 1
        if self.state is Circuit.CLOSED and self.failures >= self.threshold:
            return self._open()
        return False

    def ended(self) -> None:
        """A request ended without a verdict on the engine (the client left, a 4xx): a trial is over."""
        self.trial = False

    def _open(self) -> bool:
        self.open_until = self.clock() + self.cool_down_s
        self.trial = False
        self.trips += 1
        return True
