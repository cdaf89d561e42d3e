"""The one clock everything timed reads: the wall by default, a virtual one in the replay.

Routing, sessions and slot leases, learning, the in-flight overlay, the circuit breakers and the
watchdog, the state stores' expiry and the simulated engines take a :class:`Clock` instead of
calling :mod:`time`, so ``turnout replay --clock virtual`` can run the real router against the
engine models in simulated time (``gateway.replay.virtual``) while a served gateway behaves exactly
as before (:data:`WALL`).

Two readings, as :mod:`time` has them: ``time()`` is seconds since the epoch (timestamps, TTLs that
other processes or replicas compare), ``monotonic()`` seconds from an arbitrary start that never go
back (durations, deadlines).

:class:`Events` is the discrete-event loop that moves a :class:`VirtualClock`: callbacks at virtual
times, run in time order (ties in the order they were scheduled), the clock jumping from one to
the next. No threads, no asyncio: what a callback schedules runs when its time comes.
"""

from __future__ import annotations

import heapq
import itertools
import time
from collections.abc import Callable
from typing import Protocol

VIRTUAL_EPOCH = 1_767_225_600.0
"""Where a virtual clock's ``time()`` starts (2026-01-01T00:00:00Z): timestamps stay plausible."""


class Clock(Protocol):
    """What reads time: ``time()`` (epoch seconds) and ``monotonic()`` (never goes back)."""

    def time(self) -> float: ...

    def monotonic(self) -> float: ...


class WallClock:
    """The real clock: :func:`time.time` and :func:`time.monotonic`."""

    __slots__ = ()

    def time(self) -> float:
        return time.time()

    def monotonic(self) -> float:
        return time.monotonic()


WALL = WallClock()
"""The clock a served gateway and the HTTP simulators run on."""


class VirtualClock:
    """Time that moves only when told: ``now`` seconds since the start (``monotonic()``), and
    ``VIRTUAL_EPOCH + now`` as wall time (``time()``)."""

    __slots__ = ("epoch", "now")

    def __init__(self, start: float = 0.0, epoch: float = VIRTUAL_EPOCH) -> None:
        self.now = start
        self.epoch = epoch

    def time(self) -> float:
        return self.epoch + self.now

    def monotonic(self) -> float:
        return self.now

    def advance_to(self, at: float) -> None:
        """Move to ``at``; time never goes back."""
        if at < self.now:
            raise ValueError(f"a virtual clock cannot go back from {self.now} to {at}")
        self.now = at


class Events:
    """A discrete-event loop on a :class:`VirtualClock` (module docstring)."""

    def __init__(self, clock: VirtualClock | None = None) -> None:
        self.clock = clock or VirtualClock()
        self._heap: list[tuple[float, int, Callable[[], None]]] = []
        self._order = itertools.count()
        self.processed = 0
        """Callbacks run so far."""

    @property
    def now(self) -> float:
        return self.clock.now

    def __len__(self) -> int:
        return len(self._heap)

    def at(self, when: float, callback: Callable[[], None]) -> None:
        """Run ``callback`` at virtual time ``when`` (now, if ``when`` has passed)."""
        heapq.heappush(self._heap, (max(when, self.clock.now), next(self._order), callback))

    def after(self, delay: float, callback: Callable[[], None]) -> None:
        """Run ``callback`` ``delay`` seconds from now."""
        self.at(self.clock.now + delay, callback)

    def run(self, until: float | None = None) -> None:
        """Run callbacks in time order until none is left, or the next is later than ``until``
        (the clock then stands at ``until``)."""
        heap, clock = self._heap, self.clock
        while heap:
            when = heap[0][0]
            if until is not None and when > until:
                break
            _, _, callback = heapq.heappop(heap)
            clock.now = when
            callback()
            self.processed += 1
        if until is not None and until > clock.now:
            clock.now = until
