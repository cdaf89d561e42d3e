"""What runs a simulated engine's steps: the planned :class:`Step`, and the two drivers of it.

An engine (``engine_base.BatchEngine``) is a state machine with two moves: ``plan()`` admits waiting
tasks and returns the next :class:`Step` (None when nothing runs), ``apply(step)`` ends it (the
simulated clock advances by ``step.sim_dt``, prompts progress, tokens go out, tasks finish). Between
the two, ``sim_dt`` simulated seconds pass; tasks may arrive or be cancelled meanwhile. The engine
calls its ``waker`` when there may be new work; the driver decides what that means.

* :class:`WallDriver` (the HTTP simulators): an asyncio task that loops plan, sleep until the step's
  end (``sim_dt * time_scale`` wall seconds after the previous step's), apply; when nothing runs it
  waits for a wake. Ends are kept on a schedule, not slept one after the other: a busy machine's
  late wake-ups are caught up by the next steps, so the simulated clock keeps to the wall's (at
  ``time_scale`` 1 the times the engine reports are the wall's, as a real engine's are; slept one by
  one, every late step added its lateness, and a non-streamed answer's first token, its end less
  its reported decode time, came out seconds late on a loaded demo).
* :class:`EventDriver` (the virtual-time replay): on a :class:`~backends.clock.Events` loop, no
  asyncio, no threads. A wake while idle plans at the current virtual time (as a callback, so every
  task submitted by the running callback joins that step, as on the asyncio loop); ``apply`` runs at
  ``now + sim_dt`` (``time_scale`` does not apply: durations are simulated seconds), and the next
  step is planned right after it. A wake while a step is in flight does nothing: the next plan sees
  the new work.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Callable
from dataclasses import dataclass
from functools import partial
from typing import Protocol

from backends.clock import Clock, Events
from backends.sim.task import SimTask


@dataclass(frozen=True, slots=True)
class Step:
    """One planned engine step: prompt ``chunks`` (task, tokens) in order, the ``decoding`` tasks
    (prompt done: one token each) and the step's simulated duration ``sim_dt`` in seconds."""

    chunks: tuple[tuple[SimTask, int], ...]
    decoding: tuple[SimTask, ...]
    sim_dt: float


class Stepper(Protocol):
    """An engine as a driver sees it (``engine_base.BatchEngine`` is one)."""

    waker: Callable[[], None]
    clock: Clock

    def plan(self) -> Step | None: ...

    def apply(self, step: Step) -> None: ...


def idle() -> None:
    """The waker of an engine that no driver runs yet: nothing to do."""


class WallDriver:
    """Runs ``engine`` on the running asyncio loop in wall time, ``time_scale`` wall seconds per
    simulated second (module docstring)."""

    def __init__(
        self,
        engine: Stepper,
        time_scale: float,
        *,
        name: str = "sim",
        now: Callable[[], float] | None = None,
    ) -> None:
        self.engine = engine
        self.time_scale = time_scale
        self.name = name
        self._now = now
        """The clock the steps' ends are scheduled on (default: the event loop's)."""
        self._wake = asyncio.Event()
        self._task: asyncio.Task[None] | None = None

    def start(self) -> None:
        """Start the loop (call it on the running event loop) and take the engine's waker."""
        self.engine.waker = self._wake.set
        self._task = asyncio.create_task(self._run(), name=self.name)

    async def stop(self) -> None:
        """Stop the loop; the engine's waker does nothing again."""
        self.engine.waker = idle
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._task

    async def _run(self) -> None:
        now = self._now or asyncio.get_running_loop().time
        due: float | None = None  # when the step under way ends, on that clock
        while True:
            step = self.engine.plan()
            if step is None:
                due = None  # idle: the next step starts when it is planned
                self._wake.clear()
                await self._wake.wait()
                continue
            due = (now() if due is None else due) + step.sim_dt * self.time_scale
            await asyncio.sleep(max(due - now(), 0.0))
            self.engine.apply(step)


class EventDriver:
    """Runs ``engine`` on ``events`` in virtual time (module docstring); the engine must read the
    events' clock (``BatchEngine(config, clock=events.clock)``) so its event log and timestamps are
    virtual too."""

    def __init__(self, engine: Stepper, events: Events) -> None:
        if engine.clock is not events.clock:
            raise ValueError("the engine must run on the events' clock: pass clock=events.clock")
        self.engine = engine
        self.events = events
        self.busy = False
        """A plan is scheduled or a step is in flight."""
        self.steps = 0
        """Steps applied so far."""
        engine.waker = self.wake

    def wake(self) -> None:
        """There may be work: plan at the current virtual time unless a step is under way."""
        if not self.busy:
            self.busy = True
            self.events.at(self.events.now, self._plan)

    def _plan(self) -> None:
        step = self.engine.plan()
        if step is None:
            self.busy = False
            return
        self.events.after(step.sim_dt, partial(self._apply, step))  # a copy of the world copies it too

    def _apply(self, step: Step) -> None:
        self.engine.apply(step)
        self.steps += 1
        self._plan()
