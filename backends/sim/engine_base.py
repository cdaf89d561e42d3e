"""The step loop both simulated engines share: continuous batching on asyncio, no threads.

Each step (1) lets the engine admit waiting tasks, (2) gives prompt chunks of the running tasks up to
``prefill_chunk`` tokens in arrival order, (3) gives one decode token to every running task whose
prompt is done, then sleeps ``perf.step_seconds(prefill tokens, decoding tasks)``. After the sleep a task
whose prompt finished emits its first token (it comes from the last prompt batch's logits, so it is
free), and every decoding task emits one more. A task that emitted its whole answer finishes.
Tasks aborted during the sleep are skipped.
"""

from __future__ import annotations

import asyncio
import contextlib
from abc import ABC, abstractmethod

from backends.sim.config import SimConfig
from backends.sim.events import EventKind, EventLog, SimEvent
from backends.sim.perf import PerfModel
from backends.sim.task import SimTask, Update, UpdateKind
from backends.sim.tokenizer import Tokenizer


class BatchEngine(ABC):
    """Shared engine state: config, clock, running list, event log and the step loop."""

    def __init__(self, config: SimConfig) -> None:
        self.config = config
        self.perf = PerfModel.from_config(config)
        self.tokenizer = Tokenizer()
        self.log = EventLog()
        self.running: list[SimTask] = []
        self.sim_clock = 0.0
        self.n_tasks = 0
        self.n_decode_calls = 0
        self.n_busy_in_decode = 0
        self._wake: asyncio.Event | None = None
        self._loop_task: asyncio.Task[None] | None = None

    @property
    def events(self) -> list[SimEvent]:
        """Every lifecycle event so far, oldest first."""
        return self.log.events

    # --- lifecycle -------------------------------------------------------------------------------

    async def start(self) -> None:
        """Start the step loop on the running event loop (app startup)."""
        self._wake = asyncio.Event()
        self._loop_task = asyncio.create_task(self._run(), name=f"sim-{self.config.kind}")

    async def stop(self) -> None:
        """Stop the step loop (app shutdown)."""
        if self._loop_task is not None:
            self._loop_task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._loop_task

    def wake(self) -> None:
        """Tell the loop there may be work."""
        if self._wake is not None:
            self._wake.set()

    # --- hooks -----------------------------------------------------------------------------------

    @abstractmethod
    def admit(self) -> None:
        """Move waiting tasks into ``running`` (and send their BEGIN updates)."""

    @abstractmethod
    def on_prompt_done(self, task: SimTask) -> None:
        """Called once a task's prompt is fully processed."""

    @abstractmethod
    def on_end(self, task: SimTask, kind: EventKind) -> None:
        """Called once a task left ``running`` (finished or cancelled): free its resources."""

    # --- the loop --------------------------------------------------------------------------------

    async def _run(self) -> None:
        assert self._wake is not None
        while True:
            self.admit()
            if not self.running:
                self._wake.clear()
                await self._wake.wait()
                continue
            await self._step()

    async def _step(self) -> None:
        budget = self.config.prefill_chunk
        chunks: list[tuple[SimTask, int]] = []
        decoding = [t for t in self.running if t.prefill_left == 0]
        for task in self.running:
            if task.prefill_left > 0 and budget > 0:
                n = min(task.prefill_left, budget)
                chunks.append((task, n))
                budget -= n
        n_prefill = sum(n for _, n in chunks)
        sim_dt = self.perf.prefill_seconds(n_prefill) + self.perf.decode_step_seconds(len(decoding))
        self.n_decode_calls += 1
        self.n_busy_in_decode += len(self.running)
        await asyncio.sleep(sim_dt * self.perf.time_scale)
        self.sim_clock += sim_dt
        for task, n in chunks:
            if task in self.running:
                task.prefill_left -= n
                if task.prefill_left == 0:
                    task.sim_prompt_end = self.sim_clock
                    self.on_prompt_done(task)
                    self._emit(task)
        for task in decoding:
            if task in self.running:
                self._emit(task)

    def _emit(self, task: SimTask) -> None:
        if task.n_emitted < len(task.answer.tokens):
            task.send(Update(UpdateKind.TOKEN, token=task.answer.tokens[task.n_emitted]))
            task.n_emitted += 1
            task.sim_last = self.sim_clock
        if task.n_emitted >= len(task.answer.tokens):
            self.running.remove(task)
            task.finished = True
            self.finish_event(task)
            self.on_end(task, EventKind.FINISH)
            task.send(Update(UpdateKind.DONE))

    def begin(self, task: SimTask, slot: int | None = None) -> None:
        """Start ``task`` now with ``task.cached`` tokens reused; record the start event."""
        task.started = True
        task.slot = slot
        task.prefill_left = len(task.prompt) - task.cached
        task.sim_start = self.sim_clock
        self.running.append(task)
        self.log.record(
            EventKind.START, task.id, prompt_tokens=len(task.prompt), cached_tokens=task.cached, slot=slot
        )
        task.send(Update(UpdateKind.BEGIN))
        self.wake()

    def cancel(self, task: SimTask) -> None:
        """The client left: drop ``task`` from wherever it is and record a ``cancel`` event (idempotent)."""
        if task.finished:
            return
        task.finished = True
        self.remove_waiting(task)
        self.log.record(
            EventKind.CANCEL,
            task.id,
            prompt_tokens=len(task.prompt),
            cached_tokens=task.cached,
            completion_tokens=task.n_emitted,
            slot=task.slot,
        )
        if task in self.running:
            self.running.remove(task)
            self.on_end(task, EventKind.CANCEL)
        self.wake()

    @abstractmethod
    def remove_waiting(self, task: SimTask) -> None:
        """Drop ``task`` from the waiting queue if it is there."""

    def finish_event(self, task: SimTask) -> None:
        """Record the ``finish`` event of ``task``."""
        self.log.record(
            EventKind.FINISH,
            task.id,
            prompt_tokens=len(task.prompt),
            cached_tokens=task.cached,
            completion_tokens=task.n_emitted,
            slot=task.slot,
        )
