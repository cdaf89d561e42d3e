"""The simulated engines' two drivers: in virtual time on an event loop (``EventDriver``) a task's
token times are :class:`PerfModel`'s arithmetic, the event log is stamped by the virtual clock, and
the wall-time asyncio loop of the HTTP simulators gives the same per-task results."""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import pytest

from backends.clock import VIRTUAL_EPOCH, WALL, Clock, Events, VirtualClock
from backends.sim.config import SimConfig, SimKind
from backends.sim.drive import EventDriver
from backends.sim.events import EventKind
from backends.sim.generation import Answer, DeltaKind, OutToken
from backends.sim.llama_engine import LlamaEngine
from backends.sim.task import SimTask, Update, UpdateKind
from backends.sim.vllm_engine import VllmEngine
from policies.types import Architecture

# Round speeds: prefill 1000 tok/s, a decode step of n sequences 0.01 * (1 + 0.5 * (n - 1)) s.
SPEEDS: dict[str, Any] = {"prefill_tok_s": 1000.0, "decode_tok_s": 100.0, "batch_slowdown": 0.5}


def answer(n: int, base: int = 100) -> Answer:
    """An answer of ``n`` distinct tokens."""
    return Answer(tuple(OutToken(base + i, f"w{i}", DeltaKind.TEXT) for i in range(n)), "length", None)


Engine = VllmEngine | LlamaEngine


def engine_on(config: SimConfig, clock: Clock = WALL) -> Engine:
    """The engine of ``config.kind`` on ``clock``."""
    cls = LlamaEngine if config.kind == "llamacpp" else VllmEngine
    return cls(config, clock=clock)


class Recorder:
    """Tasks on an event-driven engine whose updates are recorded with their virtual times."""

    def __init__(self, config: SimConfig) -> None:
        self.events = Events()
        self.engine = engine_on(config, self.events.clock)
        self.driver = EventDriver(self.engine, self.events)
        self.seen: dict[str, list[tuple[float, UpdateKind]]] = {}

    def submit(self, name: str, prompt: list[int], n_tokens: int, id_slot: int = -1) -> SimTask:
        self.seen[name] = []

        def listen(update: Update) -> None:
            self.seen[name].append((self.events.now, update.kind))

        task = SimTask(name, prompt, answer(n_tokens), id_slot=id_slot, listener=listen)
        self.engine.submit(task)
        return task

    def times(self, name: str, kind: UpdateKind) -> list[float]:
        return [at for at, k in self.seen[name] if k is kind]


class TestEventDriverTiming:
    def test_one_prompt_in_chunks_then_decode(self) -> None:
        """1000 tokens at 1000 tok/s in chunks of 512: steps of 0.512 s and 0.488 s, the first
        token at 1.0 s, then one token per 0.01 s decode step."""
        rec = Recorder(SimConfig(kind="vllm", prefill_chunk=512, prefix_caching=False, **SPEEDS))
        task = rec.submit("a", list(range(1000)), 3)
        rec.events.run()
        assert rec.times("a", UpdateKind.BEGIN) == [0.0]
        assert rec.times("a", UpdateKind.TOKEN) == pytest.approx([1.0, 1.01, 1.02])
        assert rec.times("a", UpdateKind.DONE) == pytest.approx([1.02])
        assert (task.sim_prompt_end, task.sim_last) == pytest.approx((1.0, 1.02))
        assert rec.driver.steps == 4
        assert not rec.driver.busy

    def test_arrival_during_a_step_joins_the_next(self) -> None:
        """B (200 tokens) arrives at 0.3 s while A's first chunk runs; it is admitted at 0.512 s and
        takes the 24 tokens of the chunk that A's last 488 leave; its last 176 run with A's first
        decode step (0.176 + 0.01 s), then it decodes alone."""
        rec = Recorder(SimConfig(kind="vllm", prefill_chunk=512, prefix_caching=False, **SPEEDS))
        a = rec.submit("a", list(range(1000)), 2)
        tasks: dict[str, SimTask] = {}
        rec.events.at(0.3, lambda: tasks.update(b=rec.submit("b", list(range(5000, 5200)), 2)))
        rec.events.run()
        b = tasks["b"]
        assert rec.times("b", UpdateKind.BEGIN) == pytest.approx([0.512])
        assert rec.times("a", UpdateKind.TOKEN) == pytest.approx([1.024, 1.21])
        assert rec.times("b", UpdateKind.TOKEN) == pytest.approx([1.21, 1.22])
        assert (a.sim_prompt_end, a.sim_last) == pytest.approx((1.024, 1.21))
        assert (b.sim_start, b.sim_prompt_end, b.sim_last) == pytest.approx((0.512, 1.21, 1.22))

    def test_pinned_slot_waits_then_reuses_the_prefix(self) -> None:
        """llama.cpp, 2 slots: B pinned to A's busy slot waits for A (600 tokens: 0.512 + 0.088 s,
        2 tokens, ends at 0.61 s), then reuses A's first 500 tokens and prefills 200 (0.2 s)."""
        config = SimConfig(
            kind="llamacpp",
            slots=2,
            prefill_chunk=512,
            cache_ram_mib=0,
            architecture=Architecture.DENSE,
            **SPEEDS,
        )
        rec = Recorder(config)
        prompt = list(range(600))
        a = rec.submit("a", prompt, 2, id_slot=0)
        b = rec.submit("b", prompt[:500] + list(range(9000, 9200)), 2, id_slot=0)
        assert rec.times("b", UpdateKind.BEGIN) == []
        rec.events.run()
        assert (a.slot, b.slot, b.cached) == (0, 0, 500)
        assert rec.times("a", UpdateKind.TOKEN) == pytest.approx([0.6, 0.61])
        assert rec.times("b", UpdateKind.BEGIN) == pytest.approx([0.61])
        assert rec.times("b", UpdateKind.TOKEN) == pytest.approx([0.81, 0.82])

    def test_idle_engine_wakes_at_the_arrival(self) -> None:
        """After idling, a task arriving at 5.0 s starts then; the event log is stamped by the
        virtual clock, while the task's ``sim_*`` times count the engine's busy time only."""
        rec = Recorder(SimConfig(kind="vllm", prefill_chunk=512, prefix_caching=False, **SPEEDS))
        rec.submit("a", list(range(1000)), 3)
        tasks: dict[str, SimTask] = {}
        rec.events.at(5.0, lambda: tasks.update(c=rec.submit("c", list(range(7000, 7100)), 1)))
        rec.events.run()
        stamps = [(e.kind, e.request_id, e.at) for e in rec.engine.events]
        assert stamps == [
            (EventKind.START, "a", 0.0),
            (EventKind.FINISH, "a", pytest.approx(1.02)),
            (EventKind.START, "c", 5.0),
            (EventKind.FINISH, "c", pytest.approx(5.1)),
        ]
        assert (tasks["c"].sim_start, tasks["c"].sim_last) == pytest.approx((1.02, 1.12))

    def test_engine_reads_the_virtual_clock(self) -> None:
        """Start times come from the engine's clock; the driver refuses an engine on another clock."""
        clock = VirtualClock(start=3.0)
        events = Events(clock)
        vllm = VllmEngine(SimConfig(kind="vllm"), clock=clock)
        llama = LlamaEngine(SimConfig(kind="llamacpp"), clock=clock)
        assert vllm.created == VIRTUAL_EPOCH + 3.0
        assert (llama.started_at, llama.process_start) == (3.0, VIRTUAL_EPOCH + 3.0)
        EventDriver(vllm, events)
        with pytest.raises(ValueError, match="clock"):
            EventDriver(VllmEngine(SimConfig(kind="vllm")), events)

    @pytest.mark.parametrize("kind", ["vllm", "llamacpp"])
    def test_listener_cancels_on_a_token(self, kind: SimKind) -> None:
        """A listener that cancels its task on its last token stops it there: no DONE, a cancel
        event counting two tokens, and the engine goes idle."""
        rec = Recorder(SimConfig(kind=kind, prefill_chunk=512, cache_ram_mib=0, **SPEEDS))
        got: list[UpdateKind] = []

        def listen(update: Update) -> None:
            got.append(update.kind)
            if got.count(UpdateKind.TOKEN) == 2:
                rec.engine.cancel(task)

        task = SimTask("a", list(range(100)), answer(2), listener=listen)
        rec.engine.submit(task)
        rec.events.run()
        assert got == [UpdateKind.BEGIN, UpdateKind.TOKEN, UpdateKind.TOKEN]
        assert [(e.kind, e.completion_tokens) for e in rec.engine.events] == [
            (EventKind.START, 0),
            (EventKind.CANCEL, 2),
        ]
        assert not rec.engine.running
        assert not rec.driver.busy
        assert rec.events.now == pytest.approx(0.11)

    def test_a_listener_task_has_no_queue(self) -> None:
        """A task with a listener gets its updates at once and never builds an asyncio queue."""
        got: list[Update] = []
        task = SimTask("t", [1], answer(1), listener=got.append)
        task.send(Update(UpdateKind.BEGIN))
        assert got == [Update(UpdateKind.BEGIN)]
        assert not hasattr(task, "outbox")


# --- the same workload on both drivers ------------------------------------------------------------

PREFIX = list(range(1000, 2200))
N_TASKS: dict[SimKind, int] = {"vllm": 5, "llamacpp": 6}


@dataclass
class Script:
    """A workload driven by the engine's own updates, so it unfolds identically on either driver.

    ``t0`` (1,500 tokens sharing a 1,200-token prefix) and ``t1`` start together; ``t0``'s first
    token brings ``t2`` (the same prefix, pinned to ``t0``'s slot); ``t1``'s third token brings
    ``t3`` (3,000 tokens) and ``t4`` (the prefix again); ``t3`` is cancelled at the first token
    anyone emits while its prompt is part-way; on llama.cpp ``t2``'s first token also brings ``t5``,
    longer than a slot (refused). The listeners run inside the engine's step on both drivers, so
    every submit and cancel lands between the same two steps.
    """

    engine: Engine
    on_all_ended: Callable[[], None] | None = None
    tasks: dict[str, SimTask] = field(default_factory=dict)
    updates: dict[str, list[tuple[UpdateKind, int | None]]] = field(default_factory=dict)
    ended: set[str] = field(default_factory=set)
    cancelled_at_left: int | None = None

    def begin(self) -> None:
        self.submit("t0", PREFIX + list(range(300)), 8)
        self.submit("t1", list(range(3000, 3300)), 12)

    def submit(self, name: str, prompt: list[int], n_tokens: int, id_slot: int = -1) -> None:
        self.updates[name] = []
        task = SimTask(
            name,
            prompt,
            answer(n_tokens, base=10 * len(self.tasks)),
            id_slot=id_slot,
            listener=lambda update: self.on_update(name, update),
        )
        self.tasks[name] = task
        self.engine.submit(task)

    def end(self, name: str) -> None:
        self.ended.add(name)
        if len(self.ended) == N_TASKS[self.engine.config.kind] and self.on_all_ended is not None:
            self.on_all_ended()

    def on_update(self, name: str, update: Update) -> None:
        self.updates[name].append((update.kind, update.token.id if update.token else None))
        if update.kind in (UpdateKind.DONE, UpdateKind.ERROR):
            self.end(name)
        if update.kind is not UpdateKind.TOKEN:
            return
        n = sum(1 for kind, _ in self.updates[name] if kind is UpdateKind.TOKEN)
        if (name, n) == ("t0", 1):
            self.submit("t2", PREFIX + list(range(4000, 4400)), 6, id_slot=self.tasks["t0"].slot or 0)
        if (name, n) == ("t1", 3):
            self.submit("t3", list(range(5000, 8000)), 5)
            self.submit("t4", PREFIX + list(range(8000, 8050)), 4)
        if (name, n) == ("t2", 1) and isinstance(self.engine, LlamaEngine):
            self.submit("t5", list(range(20000, 29000)), 3)
        t3 = self.tasks.get("t3")
        part_way = t3 is not None and 0 < t3.prefill_left < len(t3.prompt) - t3.cached
        if t3 is not None and part_way and t3.started and not t3.finished:
            self.cancelled_at_left = t3.prefill_left
            self.engine.cancel(t3)
            self.end("t3")

    def outcome(self) -> dict[str, Any]:
        """Everything that must not depend on the driver."""
        tasks = {
            name: (t.cached, t.slot, t.sim_start, t.sim_prompt_end, t.sim_last, t.n_emitted, t.prefill_left)
            for name, t in self.tasks.items()
        }
        log = [
            (e.kind, e.request_id, e.prompt_tokens, e.cached_tokens, e.completion_tokens, e.slot)
            for e in self.engine.events
        ]
        counters = (self.engine.sim_clock, self.engine.n_decode_calls, self.engine.n_busy_in_decode)
        return {"tasks": tasks, "updates": self.updates, "log": log, "counters": counters}


def workload_config(kind: SimKind) -> SimConfig:
    return SimConfig(
        kind=kind,
        slots=2,
        context_window=8192,
        prefix_caching=True,
        prefill_chunk=512,
        time_scale=0.001,
        **SPEEDS,
    )


def run_on_events(kind: SimKind) -> tuple[Script, Events]:
    events = Events()
    engine = engine_on(workload_config(kind), events.clock)
    EventDriver(engine, events)
    script = Script(engine)
    script.begin()
    events.run()
    return script, events


def run_on_wall(kind: SimKind) -> Script:
    """The HTTP simulators' driver; waits for the script's end (a generous bound only stops a hang)."""

    async def main() -> Script:
        engine = engine_on(workload_config(kind))
        done = asyncio.Event()
        script = Script(engine, on_all_ended=done.set)
        await engine.start()
        try:
            script.begin()
            await asyncio.wait_for(done.wait(), timeout=300)
        finally:
            await engine.stop()
        return script

    return asyncio.run(main())


@pytest.mark.parametrize("kind", ["vllm", "llamacpp"])
class TestDriversAgree:
    def test_workload_exercises_the_rules(self, kind: SimKind) -> None:
        """The scripted workload hits a prefix cache, a cancel mid-prefill and (llama.cpp) a pinned
        slot that waits, and everything ends."""
        script, events = run_on_events(kind)
        tasks = script.tasks
        assert script.ended == set(tasks)
        assert tasks["t2"].cached > 0
        assert script.cancelled_at_left is not None
        assert tasks["t3"].n_emitted == 0
        assert [e.kind for e in script.engine.events if e.request_id == "t3"] == [
            EventKind.START,
            EventKind.CANCEL,
        ]
        if kind == "vllm":
            assert tasks["t4"].cached == tasks["t2"].cached == 1024  # the prefix's whole 256-token blocks
        else:
            assert tasks["t2"].slot == tasks["t0"].slot
            at = {(e.kind, e.request_id): e.at for e in script.engine.events}
            assert at[EventKind.START, "t2"] == at[EventKind.FINISH, "t0"]
            assert script.updates["t5"][-1][0] is UpdateKind.ERROR
        # no idle time: the busy time is the virtual time, and the log is stamped with it
        for event in script.engine.events:
            task = tasks[event.request_id]
            if event.kind is EventKind.START:
                assert event.at == task.sim_start
            if event.kind is EventKind.FINISH:
                assert event.at == task.sim_last
        assert events.now == script.engine.sim_clock

    def test_wall_and_event_drivers_agree(self, kind: SimKind) -> None:
        """Cached tokens, slots, simulated times, updates and the event log are the same."""
        virtual, _ = run_on_events(kind)
        wall = run_on_wall(kind)
        assert wall.outcome() == virtual.outcome()


def test_the_wall_driver_keeps_the_simulated_clock_to_the_wall(monkeypatch: pytest.MonkeyPatch) -> None:
    """Five steps of 50 ms, one of them woken 100 ms late (a busy machine): the next ones catch up,
    and the fifth ends at 250 ms, when its simulated time says, not 100 ms later (a non-streamed
    answer's first token is its end less the decode time the engine reports: slept step after step,
    every late wake-up moved it later)."""
    from backends.sim import drive
    from backends.sim.drive import Step, WallDriver

    wall = [0.0]
    ends: list[float] = []

    async def sleep(seconds: float) -> None:
        wall[0] += seconds
        if len(ends) == 1:
            wall[0] += 0.1  # this wake-up comes late

    class Five:
        waker: Callable[[], None] = staticmethod(lambda: None)
        clock = WALL

        def plan(self) -> Step | None:
            return Step((), (), 0.05) if len(ends) < 5 else None

        def apply(self, step: Step) -> None:
            ends.append(round(wall[0], 6))

    monkeypatch.setattr(drive.asyncio, "sleep", sleep)

    async def main() -> None:
        driver = WallDriver(Five(), 1.0, now=lambda: wall[0])
        run = asyncio.ensure_future(driver._run())
        while len(ends) < 5:
            await asyncio.wait([run], timeout=0)  # the fake sleep never yields: one pass runs it all
        run.cancel()

    asyncio.run(main())
    assert ends == [0.05, 0.2, 0.2, 0.2, 0.25]
