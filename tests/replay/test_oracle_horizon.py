"""The hindsight oracle's look-ahead (``gateway.replay.oracle``): a conversation's remaining turns,
priced cold on an engine without slots and warm on a llama.cpp slot at that backend's own checkpoint
gap (its profile's ``min(batch, 4 + ubatch)``)."""

from __future__ import annotations

import pytest

from backends.engine_profiles import load_profile
from backends.sim import SimConfig
from gateway.replay.oracle import TEMPLATE_TAIL, THREAD_TAIL, Horizon, engines_of, horizons
from gateway.replay.synth import threaded
from gateway.replay.traces import TraceRequest


def turn(t: float, tokens: int) -> TraceRequest:
    return TraceRequest(t, "s", "m", tokens, tuple(range(tokens // 512 + 1)), 16)


def test_a_turn_that_rewrites_the_last_message_counts_its_growth_and_the_slots_gap_once() -> None:
    """Turns sent as one growing user message (not threaded: ``splits`` empty) diverge inside the
    previous prompt's template tail, so the slot goes back to its checkpoint a gap before it."""
    first, second, third = horizons([turn(0.0, 4000), turn(1.0, 6000), turn(2.0, 6500)])
    assert third == Horizon(0, 0, 0)
    assert second == Horizon(6500, 500 + TEMPLATE_TAIL, 1)
    assert first == Horizon(12500, 2000 + 500 + 2 * TEMPLATE_TAIL, 2)


def test_the_warm_future_is_priced_at_each_llama_servers_own_gap() -> None:
    configs = {
        "vllm": SimConfig(kind="vllm", model="m"),
        "llama": SimConfig(kind="llamacpp", model="m"),  # no profile: llama-server's default, 516
        "compose": SimConfig(
            kind="llamacpp", model="m", profile=load_profile("workstation-llamacpp-flash-next-cpu-moe")
        ),
    }
    engines = engines_of(configs)
    assert dict(engines.gaps) == {"llama": 516, "compose": 2048}
    horizon = Horizon(cold=12500, warm=2516, turns=2)
    assert engines.future_s("vllm", horizon) == pytest.approx(12500 / engines.rates["vllm"])
    assert engines.future_s("llama", horizon) == pytest.approx((2516 + 2 * 516) / engines.rates["llama"])
    assert engines.future_s("compose", horizon) == pytest.approx((2516 + 2 * 2048) / engines.rates["compose"])
    assert engines.elsewhere_s(horizon) == pytest.approx(12500 / engines.rates["vllm"])


def test_a_turn_that_goes_on_from_the_previous_prompt_pays_no_gap() -> None:
    """Threaded turns (the previous answer and the new text as messages after the previous prompt)
    resume from the checkpoint 4 tokens before the previous prompt's end: growth and the template of
    the two new messages, 16 tokens, and no gap."""
    assert THREAD_TAIL == 4 + 2 + 3 + 2 + 5
    first, second, third = horizons(threaded([turn(0.0, 4000), turn(1.0, 6000), turn(2.0, 6500)]))
    assert third == Horizon(0, 0, 0)
    assert second == Horizon(6500, 500 + THREAD_TAIL, 0)
    assert first == Horizon(12500, 2000 + 500 + 2 * THREAD_TAIL, 0)
