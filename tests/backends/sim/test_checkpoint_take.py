"""The simulated llama-server pays for each context checkpoint it takes (``prefill.checkpoint_s``), as
the real one did on the H100 (bench/gpu/results/2026-12-07b-h100-q8-checkpoints/): a hybrid prompt
takes one where its processing starts near the end, one where its last user message starts and one
4 tokens before its end; each copy is inside the request's own ``prompt_ms`` and stops every other
slot too. A dense model takes none."""

from __future__ import annotations

import pytest

from backends.sim.whatif import whatif_llama
from policies.types import Architecture
from tests.backends.sim.test_checkpoint_restore import Server

TAKE_S = 0.125


def run(take_s: float, architecture: Architecture = Architecture.HYBRID) -> tuple[list[float], float]:
    """Slot 1 answers 300 tokens to a 4-token prompt (it takes no checkpoint) while slot 0 has a cold
    chat prompt (its user message at 10), then a turn of 400 tokens whose user message starts 80
    tokens in: each prompt's time, and when slot 1's answer ended."""
    server = Server(0.0, architecture, take_s=take_s)
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
    server = Server(0.0, take_s=TAKE_S)
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
