"""The step rules both simulated engines share: continuous batching as a state machine.

Each step (1) lets the engine admit waiting tasks, (2) gives prompt chunks of the running tasks up to
``prefill_chunk`` tokens in arrival order (cut where the engine profile says the real engine cuts:
llama-server's checkpoints near a prompt's end), (3) gives one decode token to every running task
whose prompt is done; it lasts what the engine profile prices its chunks and its decode step at
(``perf.step_seconds``, simulated seconds). At its end a task whose prompt finished emits its first
token (it comes from the last prompt batch's logits, so it is free), and every decoding task emits
one more. A task that emitted its whole answer finishes. Tasks cancelled during the step are skipped.

``plan()`` is the start of a step (1-3, returning a :class:`~backends.sim.drive.Step`), ``apply()``
its end; a driver (``backends.sim.drive``) lets the time pass between them: in wall time on asyncio
(``start()`` / ``stop()``, what the HTTP apps use) or in virtual time on an event loop. Timestamps
(the event log, start times) come from the ``clock`` the engine is given (the wall by default).
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Callable

from backends.clock import WALL, Clock
from backends.sim.config import SimConfig
from backends.sim.drive import Step, WallDriver, idle
from backends.sim.events import EventKind, EventLog, SimEvent
from backends.sim.perf import PerfModel
from backends.sim.task import SimTask, Update, UpdateKind
from backends.sim.tokenizer import Tokenizer


class BatchEngine(ABC):
    """Shared engine state: config, clock, running list, event log and the step rules."""

    def __init__(self, config: SimConfig, *, clock: Clock = WALL) -> None:
        self.config = config
        self.clock = clock
        self.perf = PerfModel.from_config(config)
        self.tokenizer = Tokenizer()
        self.log = EventLog(clock)
        self.running: list[SimTask] = []
        self.sim_clock = 0.0
        self.stall_s = 0.0
        """Seconds the engine stops for before its next step (llama.cpp: RAM-cache saves)."""
        self.n_tasks = 0
        self.n_decode_calls = 0
        self.n_busy_in_decode = 0
        self.waker: Callable[[], None] = idle
        """Called when there may be work; the driver running the engine sets it."""
        self._wall: WallDriver | None = None

    @property
    def events(self) -> list[SimEvent]:
        """Every lifecycle event so far, oldest first."""
        return self.log.events

    # --- lifecycle -------------------------------------------------------------------------------

    async def start(self) -> None:
        """Run the steps in wall time on the running event loop (app startup)."""
        self._wall = WallDriver(self, self.perf.time_scale, name=f"sim-{self.config.kind}")
        self._wall.start()

    async def stop(self) -> None:
        """Stop the wall-time loop (app shutdown)."""
        if self._wall is not None:
            await self._wall.stop()

    def wake(self) -> None:
        """Tell the driver there may be work."""
        self.waker()

    # --- hooks -----------------------------------------------------------------------------------

    @abstractmethod
    def submit(self, task: SimTask) -> None:
        """Take a validated request (it starts now, or waits)."""

    @abstractmethod
    def admit(self) -> None:
        """Move waiting tasks into ``running`` (and send their BEGIN updates)."""

    @abstractmethod
    def on_prompt_done(self, task: SimTask) -> None:
        """Called once a task's prompt is fully processed."""

    @abstractmethod
    def on_end(self, task: SimTask, kind: EventKind) -> None:
        """Called once a task left ``running`` (finished or cancelled): free its resources."""

    # --- the step --------------------------------------------------------------------------------

    def plan(self) -> Step | None:
        """Start a step: admit, pick the prompt chunks and the decoding tasks, count the step.

        None when nothing runs (nothing is counted then)."""
        self.admit()
        if not self.running:
            return None
        budget = self.config.prefill_chunk
        chunks: list[tuple[SimTask, int]] = []
        decoding = tuple(t for t in self.running if t.prefill_left == 0)
        for task in self.running:
            if task.prefill_left > 0 and budget > 0:
                n = self.perf.profile.step_tokens(
                    task.prefill_left, budget, prompt=len(task.prompt), user_start=task.user_start
                )
                if n > 0:  # 0: an aligned step's budget left holds no whole block (vLLM align mode)
                    chunks.append((task, n))
                    budget -= n
        priced = [
            (n, len(task.prompt) - task.prefill_left, task.prefill_left == len(task.prompt) - task.cached)
            for task, n in chunks
        ]
        context = sum(len(t.prompt) + t.n_emitted for t in decoding)
        sim_dt = self.perf.step_seconds(priced, len(decoding), context) + self.stall_s
        self.stall_s = 0.0
        self.n_decode_calls += 1
        self.n_busy_in_decode += len(self.running)
        return Step(tuple(chunks), decoding, sim_dt)

    def apply(self, step: Step) -> None:
        """End ``step``: advance the simulated clock, apply its chunks, emit its tokens (tasks
        cancelled since the plan are skipped)."""
        self.sim_clock += step.sim_dt
        for task, n in step.chunks:
            if task in self.running:
                task.prefill_left -= n
                if task.prefill_left == 0:
                    task.sim_prompt_end = self.sim_clock
                    self.on_prompt_done(task)
                    self._emit(task)
        for task in step.decoding:
            if task in self.running:
                self._emit(task)

    def _emit(self, task: SimTask) -> None:
        if task.n_emitted < len(task.answer.tokens):
            token = task.answer.tokens[task.n_emitted]
            task.n_emitted += 1
            task.sim_last = self.sim_clock
            task.send(Update(UpdateKind.TOKEN, token=token))
            if task.finished:  # a listener cancelled it on this token
                return
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
