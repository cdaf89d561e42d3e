"""``turnout calibrate``'s whole procedure against the simulated llama-server in virtual time: its
profile comes back. The engine model runs a profile with a per-request cost, RAM-cache saves, context
checkpoints restored and taken; calibrate, measuring it as a client (its first request uncounted, the
saves and checkpoints out of every point before the fit), recovers each of them. Decode is not what
this test is about: the engine model's step is returned as measured."""

from __future__ import annotations

import asyncio
from collections.abc import Sequence

import pytest
from msgspec.structs import replace

from backends.calibrate.engines import Engine, EngineInfo, Prefill
from backends.calibrate.procedure import calibrate
from backends.calibrate.run import Options
from policies.engine_profile import EngineProfile
from tests.backends.test_calibrate_saves import PROFILE
from tests.backends.test_calibrate_saves import Engine as Server

TRUTH = replace(
    PROFILE,
    # 512-token micro-batches: the engine model takes its near-end checkpoints 516 before the end (at
    # any --ubatch-size, docs/routing.md), which calibrate's book then expects too
    prefill=replace(
        PROFILE.prefill, request_s=0.02, checkpoint_s=0.1, context_s=0.0, batch_s=0.0, ubatch=512
    ),
    cache=replace(
        PROFILE.cache,
        ram_save_s=0.08,
        ram_save_token_s=4e-5,
        ram_save_checkpoint_s=0.09,
        checkpoint_restore_s=0.03,
    ),
)


class VirtualEngine(Engine):
    """The calibration API over the engine model: each request sent when the last ended, timed on the
    virtual clock as a client sees it."""

    engine = "llamacpp"

    def __init__(self, server: Server) -> None:
        info = EngineInfo("llamacpp", "m", 32768, 2)
        super().__init__(None, info, range(1000, 200_000), seed=3)  # type: ignore[arg-type]  # no HTTP
        self.server = server

    async def busy(self) -> int:
        return 0

    async def prefill(self, tokens: Sequence[int], slot: int = 0) -> Prefill:
        seconds, _ = self.server.send(tokens, slot)
        task = self.server.last
        return Prefill(seconds, task.prompt_tokens - task.cached, task.cached)

    async def decode(self, prompts: Sequence[Sequence[int]], n_tokens: int) -> float:
        for slot, tokens in enumerate(prompts):  # the slots hold them, as after a real decode
            self.server.send(tokens, slot)
        profile = self.server.sim.perf.profile
        return profile.decode_step_seconds(len(prompts), sum(len(p) + n_tokens // 2 for p in prompts))

    async def erase(self, slot: int) -> None:
        return None


def calibrated(truth: EngineProfile) -> EngineProfile:
    server = Server(profile=truth)
    engine = VirtualEngine(server)
    options = Options(name="virtual", budget_s=600, ubatch=truth.prefill.ubatch, batch=truth.prefill.batch)
    clock = server.events.clock.monotonic
    return asyncio.run(calibrate(engine, options, clock=clock, progress=lambda _: None))


def test_the_profile_comes_back() -> None:
    got = calibrated(TRUTH)
    assert got.prefill.checkpoint_s == pytest.approx(TRUTH.prefill.checkpoint_s, rel=0.02)
    assert got.cache.checkpoint_restore_s == pytest.approx(TRUTH.cache.checkpoint_restore_s, abs=0.002)
    assert got.cache.ram_save_s == pytest.approx(TRUTH.cache.ram_save_s, rel=0.02)
    assert got.cache.ram_save_token_s == pytest.approx(TRUTH.cache.ram_save_token_s, rel=0.02)
    assert got.cache.ram_save_checkpoint_s == pytest.approx(TRUTH.cache.ram_save_checkpoint_s, rel=0.02)
    assert got.prefill.token_s == pytest.approx(TRUTH.prefill.token_s, rel=0.02)
    assert got.prefill.request_s == pytest.approx(TRUTH.prefill.request_s, abs=0.005)
    for point in got.prefill_points:  # what each point measured, less its saves, the profile says
        assert got.prefill_seconds(point.a, point.b) == pytest.approx(point.seconds, rel=0.02)


def test_the_take_comes_back_where_attention_prices_the_tokens() -> None:
    """A checkpoint taken is timed against 12 more tokens, priced by the fit so far: with attention in
    the engine, a fit without it puts its share into every token and prices those 12 too high (the
    take came out 8% short). The probe's short conversation keeps the small step each take carries
    cheap on the real engines (tests/real/test_profile_agreement.py: on the CPU build's tiny model, at
    3,600 tokens of context, that step cost more than a whole 16-token prompt)."""
    attention = replace(TRUTH, prefill=replace(TRUTH.prefill, context_s=2e-4))
    got = calibrated(attention)
    assert got.prefill.checkpoint_s == pytest.approx(TRUTH.prefill.checkpoint_s, rel=0.02)
