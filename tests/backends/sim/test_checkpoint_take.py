"""The simulated llama-server pays for each context checkpoint it takes (``prefill.checkpoint_s``), as
the real one did on the H100 (bench/gpu/results/2026-12-07b-h100-q8-checkpoints/): a hybrid prompt
takes one where its processing starts near the end, one where its last user message starts and one
4 tokens before its end; each copy is inside the request's own ``prompt_ms`` and stops every other
slot too. A dense model takes none."""

from __future__ import annotations

import msgspec
import pytest

from backends.clock import Events
from backends.engine_profiles import load_profile
from backends.sim.config import SimConfig
from backends.sim.drive import EventDriver
from backends.sim.generation import Answer, DeltaKind, OutToken
from backends.sim.llama_engine import LlamaEngine
from backends.sim.task import SimTask
from backends.sim.whatif import whatif_llama
from policies.types import Architecture

TAKE_S = 0.125


class Server:
    """Two slots in virtual time, each request pinned to its slot."""

    def __init__(self, take_s: float, architecture: Architecture = Architecture.HYBRID) -> None:
        profile = load_profile("h100-llamacpp-27b-shape-q8_0-dense")
        prefill = msgspec.structs.replace(profile.prefill, checkpoint_s=take_s, ubatch=2048, batch=2048)
        config = SimConfig(
            kind="llamacpp",
            architecture=architecture,
            context_window=65536,
            profile=msgspec.structs.replace(profile, prefill=prefill),
        )
        self.events = Events()
        self.engine = LlamaEngine(config, clock=self.events.clock)
        EventDriver(self.engine, self.events)

    def task(self, prompt: list[int], slot: int, answer: int = 1, user_start: int = -1) -> SimTask:
        tokens = tuple(OutToken(9_000_000 + i, "w", DeltaKind.TEXT) for i in range(answer))
        return SimTask(f"t{len(prompt)}-{slot}", prompt, Answer(tokens, "length", None), id_slot=slot,
                       listener=lambda _: None, user_start=user_start)  # fmt: skip


def run(take_s: float, architecture: Architecture = Architecture.HYBRID) -> tuple[list[float], float]:
    """Slot 1 answers 300 tokens to a 4-token prompt (it takes no checkpoint) while slot 0 has a cold
    chat prompt (its user message at 10), then a turn of 400 tokens whose user message starts 80
    tokens in: each prompt's time, and when slot 1's answer ended."""
    server = Server(take_s, architecture)
    long = server.task([7, 8, 9, 10], 1, answer=300)
    conversation = list(range(2000))
    cold = server.task(conversation, 0, user_start=10)
    turn = server.task(conversation + list(range(5000, 5400)), 0, user_start=2080)
    server.engine.submit(long)
    server.engine.submit(cold)
    server.events.at(2.0, lambda: server.engine.submit(turn))
    server.events.run()
    assert long.sim_last > turn.sim_prompt_end  # slot 1 decoded through both prompts
    return [t.sim_prompt_end - t.sim_start for t in (cold, turn)], long.sim_last


def test_each_checkpoint_taken_is_in_the_prompt_time_and_every_slot_waits() -> None:
    (cold, turn), ended = run(TAKE_S)
    (cold_free, turn_free), ended_free = run(0.0)
    assert cold - cold_free == pytest.approx(2 * TAKE_S)  # at its user message (10) and 4 before its end
    # where it starts, at 2,080 and 4 before its end (it arrived inside a decode step: a few us move)
    assert turn - turn_free == pytest.approx(3 * TAKE_S, abs=1e-4)
    assert ended - ended_free == pytest.approx(5 * TAKE_S, abs=1e-4)  # slot 1 waited for all five


def test_a_dense_model_takes_none() -> None:
    assert run(TAKE_S, Architecture.DENSE) == run(0.0, Architecture.DENSE)


def test_whatif_prices_the_checkpoints_the_turn_takes() -> None:
    """``/_sim/whatif`` on an idle slot predicts the turn's prompt time with its three checkpoints (its
    user message's among them) as the engine then takes it."""
    server = Server(TAKE_S)
    conversation = list(range(2000))
    server.engine.submit(server.task(conversation, 0, user_start=10))
    server.events.run()
    prompt = conversation + list(range(5000, 5400))
    predicted = whatif_llama(server.engine, prompt, id_slot=0, user_start=2080)
    turn = server.task(prompt, 0, user_start=2080)
    server.engine.submit(turn)
    server.events.run()
    assert predicted.cached_tokens == turn.cached
    assert predicted.prefill_s == pytest.approx(turn.sim_prompt_end - turn.sim_start)
