"""Calibrate's account of llama-server's RAM-cache saves (``backends.calibrate.saves``), held against
the simulated llama-server (its slot choice and RAM cache follow the real one's, contract-tested in
``tests/real/test_llama_ram_cache_contract.py``) with the H100 27B profile's saves, in virtual time:
the book names exactly the saves the engine stopped for, and ``measure`` recovers their cost."""

from __future__ import annotations

import asyncio
import random
from collections.abc import Awaitable, Callable, Sequence
from typing import Any

import pytest
from msgspec.structs import replace

from backends.calibrate.engines import Prefill
from backends.calibrate.run import Options, Run
from backends.calibrate.saves import SaveCost, SlotBook, fit, measure
from backends.clock import Events
from backends.engine_profiles import load_profile
from backends.sim.config import SimConfig
from backends.sim.drive import EventDriver
from backends.sim.generation import Answer, DeltaKind, OutToken
from backends.sim.llama_engine import LlamaEngine
from backends.sim.task import SimTask
from policies.engine_profile import EngineProfile, Point
from policies.types import Architecture

TRUTH = SaveCost(0.5425, 3.126e-05, 0.08)  # the H100 27B's line, and a part per checkpoint
_BUILT_IN = load_profile("h100-llamacpp-27b-shape-q8_0-dense")
PROFILE = replace(
    _BUILT_IN,
    prefill=replace(
        _BUILT_IN.prefill, checkpoint_s=0.0
    ),  # the saves alone (checkpoints: test_calibrate_restore)
    cache=replace(
        _BUILT_IN.cache,
        ram_save_s=TRUTH.fixed,
        ram_save_token_s=TRUTH.per_token,
        ram_save_checkpoint_s=TRUTH.per_checkpoint,
    ),
)


class Engine:
    """The simulated server; each request one token, pinned to its slot, sent when the last ended."""

    def __init__(
        self,
        *,
        kv_unified: bool = False,
        profile: EngineProfile = PROFILE,
        architecture: Architecture = Architecture.HYBRID,
    ) -> None:
        config = SimConfig(
            kv_unified=kv_unified,
            kind="llamacpp",
            architecture=architecture,
            context_window=32768,
            profile=profile,
        )
        self.events = Events()
        self.sim = LlamaEngine(config, clock=self.events.clock)
        EventDriver(self.sim, self.events)
        self.rng = random.Random(7)

    def prompt(self, n: int) -> list[int]:
        return [self.rng.randrange(1000, 200_000) for _ in range(n)]

    def send(self, tokens: Sequence[int], slot: int) -> tuple[float, float]:
        """The client's seconds to the first token, and what of it the engine stopped for saves."""
        answer = Answer((OutToken(7, "w", DeltaKind.TEXT),), "length", None)
        task = SimTask(f"t{self.rng.random()}", list(tokens), answer, id_slot=slot, listener=lambda _: None)
        self.last = task
        sent, stalled = self.events.now, self.sim.stall_s
        self.sim.submit(task)
        stall = self.sim.stall_s - stalled
        self.events.run()
        return task.sim_prompt_end - sent, stall


def test_the_book_names_every_save_the_engine_stopped_for() -> None:
    engine = Engine()
    book = SlotBook(gap=engine.sim.checkpoint_gap)  # as calibrate sets it, from the server's flags
    a, b = engine.prompt(3000), engine.prompt(800)
    script = [
        (a[:1000], 0), (a[:2000], 0),  # a conversation grows on slot 0: nothing to save
        (b, 1),  # slot 0 saved after the launch
        (b + engine.prompt(50), 1),  # continues slot 1; slot 0 saved already
        (engine.prompt(600), 0),  # slot 0 taken for another prompt (in the cache already); slot 1 saved
        (a[:3000], 0),  # slot 0's fresh prompt saved first (a's comes back from the RAM cache)
        (engine.prompt(40), 1),  # slot 1 taken for another prompt: saved already; slot 0 idle: saved
    ]  # fmt: skip
    for tokens, slot in script:
        saves = book.launch(tokens, slot)
        _, stall = engine.send(tokens, slot)
        assert stall == pytest.approx(sum(TRUTH.seconds(t) for t in saves)), (len(tokens), slot, saves)
    assert [len(v) for _, v in sorted(book.held.items())] == [3000, 40]


def sender(engine: Engine, book: SlotBook) -> Callable[[Sequence[int], int], Awaitable[Prefill]]:
    async def send(tokens: Sequence[int], slot: int) -> Prefill:
        saved = book.launch(tokens, slot)
        seconds, _ = engine.send(tokens, slot)
        return Prefill(seconds, engine.last.prompt_tokens - engine.last.cached, engine.last.cached, saved)

    return send


def test_with_a_unified_kv_cache_measure_says_it_cannot_time_a_save() -> None:
    """With ``--kv-unified`` the idle slot saved is also cleared: slot 1 loses its prompt between the
    probes, which would time a re-prefill as a save (1.68 s for 0.54)."""
    engine, book = Engine(kv_unified=True), SlotBook()
    assert asyncio.run(measure(sender(engine, book), book, engine.prompt, [1024, 8192])) is None


def test_measure_recovers_the_engines_save_cost_and_takes_it_out() -> None:
    engine = Engine()
    book = SlotBook(gap=engine.sim.checkpoint_gap)  # as calibrate sets it, from the server's flags

    got = asyncio.run(measure(sender(engine, book), book, engine.prompt, [1024, 8192]))
    assert got is not None
    assert got.fixed == pytest.approx(TRUTH.fixed, rel=1e-6)
    assert got.per_token == pytest.approx(TRUTH.per_token, rel=1e-6)
    assert got.per_checkpoint == pytest.approx(TRUTH.per_checkpoint, rel=1e-6)
    fresh = engine.prompt(500)  # slot 0 holds the 8,192 tokens, slot 1 the probes: both are saved
    saves = book.launch(fresh, 0)
    seconds, stall = engine.send(fresh, 0)
    assert stall == pytest.approx(sum(TRUTH.seconds(t) for t in saves))
    assert got.without(seconds, saves) == pytest.approx(seconds - stall, abs=1e-5)


@pytest.mark.parametrize(
    "held",
    [
        ((1024, 2), (8192, 2), (1152, 18)),  # --ubatch-size 512: two checkpoints a prompt, two a turn
        ((1024, 1), (8192, 2), (1152, 17)),  # 2048: a 1,024-token prompt leaves only N - 4
    ],
)
def test_the_fit_recovers_each_part_whatever_checkpoints_the_prompts_left(
    held: tuple[tuple[int, int], ...],
) -> None:
    got = fit([(h, TRUTH.seconds(h)) for h in held])
    assert (got.fixed, got.per_token, got.per_checkpoint) == pytest.approx(
        (TRUTH.fixed, TRUTH.per_token, TRUTH.per_checkpoint), rel=1e-9
    )


def test_without_a_checkpoints_part_the_fit_is_the_line_through_two_sizes() -> None:
    line = SaveCost(0.08, 7.5e-05)
    got = fit([(h, line.seconds(h)) for h in ((1024, 1), (8192, 2), (1152, 17))])
    assert (got.fixed, got.per_token, got.per_checkpoint) == pytest.approx((0.08, 7.5e-05, 0.0), abs=1e-12)


def test_a_point_is_its_fastest_try_once_the_saves_are_out() -> None:
    """The H100's 27B: calibrate's first request (16 tokens, no save to wait for) took 0.314 s, the
    second 0.42 s of which 0.21 s was the save of the first: the point is the second, 0.21 s; keeping
    the fastest as timed made the fit's per-request cost 0.13 s where 0.03 s was right."""
    engine: Any = None  # not used: no request is sent
    run = Run(
        engine, Options(name="t"), clock=lambda: 0.0, progress=print, started=0.0, shape=PROFILE.prefill
    )
    first, second = Prefill(0.314, 16, 0, ()), Prefill(0.42, 16, 0, ((16, 1),))
    run.add_point(first, second)
    assert run.prefill == [Point(16, 0, 0.314)]  # no save measured yet: as timed
    run.saves = SaveCost(0.121, 40.6e-6, 0.091)
    run.without_saves()
    assert run.prefill == [Point(16, 0, round(0.42 - (0.121 + 16 * 40.6e-6 + 0.091), 6))]
