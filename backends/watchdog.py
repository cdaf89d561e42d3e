"""Deadlines for silent engines: a queued or prefilling request is waited for, a hung engine is not.

An engine may be silent for long and still be fine: llama-server sends no headers while a request
waits for a slot, and no bytes while it processes a long prompt. It may also be silent because it
hung (it accepts connections and never answers) or stalled mid-answer. ``Watchdog`` tells these
apart with the probes' view of the engine (``liveness``: ``None`` when it is down, else whether it
reports requests running or queued):

- **waiting** for the first byte: checked every ``CHECK_S``. The engine down: give up at once.
  Reporting work (our request queued or being prefilled, or others ahead of it): keep waiting, up
  to ``longest_s`` in all. Reporting nothing while we wait: hung, give up after ``first_byte_s``.
- **streaming**, once the first event arrived: give up after ``idle_s`` without a byte from the
  engine. Time spent handing bytes to a slow client does not count (``reading`` is off then).

Giving up cancels the task that waits and turns the cancellation into :class:`Expired` (as
``asyncio.timeout`` does), so the caller can re-route (nothing reached the client yet) or end the
stream with an error event. While streaming, a read only stores the time (``fed``); a timer fires
once per ``idle_s`` and re-arms from the last read, so the cost per chunk is one clock call.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable
from types import TracebackType

CHECK_S = 1.0


class Expired(Exception):
    """The engine stayed silent past a deadline; ``message`` says which and why."""

    def __init__(self, message: str) -> None:
        super().__init__(message)
        self.message = message


class Watchdog:
    def __init__(
        self,
        liveness: Callable[[], bool | None],
        *,
        first_byte_s: float,
        longest_s: float,
        idle_s: float,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.liveness = liveness
        self.first_byte_s = first_byte_s
        self.longest_s = longest_s
        self.idle_s = idle_s
        self.clock = clock
        self.streaming = False
        self.reading = False
        """Set while the stream waits for the engine's bytes (not while it waits for the client)."""
        self.started = self.quiet_since = self.last = clock()
        self.expired: str | None = None
        self._task: asyncio.Task[object] | None = None
        self._timer: asyncio.TimerHandle | None = None

    def fed(self) -> None:
        """Bytes arrived (the hot path: no timer is touched)."""
        self.last = self.clock()

    def stream(self) -> None:
        """The first event arrived: from now on only silence between bytes counts."""
        self.streaming = True
        self.last = self.clock()

    def __enter__(self) -> Watchdog:
        self._task = asyncio.current_task()
        self.expired = None
        self._arm(CHECK_S if not self.streaming else self.idle_s)
        return self

    def __exit__(
        self, kind: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None
        ours = self.expired is not None and kind is asyncio.CancelledError and self._task is not None
        if ours and self._task is not None and self._task.uncancel() == 0:  # nobody else cancelled it
            raise Expired(str(self.expired)) from exc

    def expire(self, reason: str) -> None:
        """End the wait now (the gateway is shutting down), if something waits."""
        if self._task is not None and self._timer is not None:
            self._timer.cancel()
            self._timer = None
            self.expired = reason
            self._task.cancel()

    def _arm(self, delay: float) -> None:
        self._timer = asyncio.get_running_loop().call_later(max(delay, 0.0), self._check)

    def _check(self) -> None:
        now = self.clock()
        reason = self._verdict(now)
        if reason is None:
            self._arm(CHECK_S if not self.streaming else self.last + self.idle_s - now)
            return
        self.expired = reason
        self._timer = None
        if self._task is not None:
            self._task.cancel()

    def _verdict(self, now: float) -> str | None:
        if self.streaming:
            if not self.reading:
                self.last = now  # the client is being sent to: the engine is not silent
                return None
            silent = now - self.last
            return f"no data for {silent:.0f} s mid-stream (stalled)" if silent >= self.idle_s else None
        alive = self.liveness()
        if alive is None:
            return "the engine went down while the request waited for it"
        if alive:
            self.quiet_since = now  # queued or working: the silence is explained
        if now - self.quiet_since >= self.first_byte_s:
            return (
                f"no answer in {self.first_byte_s:g} s while the engine reported nothing running "
                "or queued (hung)"
            )
        if now - self.started >= self.longest_s:
            return f"no answer in {self.longest_s:g} s"
        return None
