"""Replicas' learning merged: weighted by samples (capped), never counted twice, priors kept."""

from __future__ import annotations

from hypothesis import given
from hypothesis import strategies as st

from policies import Architecture, Deployment, EngineKind
from policies.decision import Outcome
from policies.learning import MERGE_WEIGHT_CAP, LearnedState, learn
from policies.learning_merge import merge
from policies.types import Usage

LLAMA = Deployment("m", "llama", "up", 65536, Architecture.HYBRID)
VLLM = Deployment("m", "vllm", "up", 94000, Architecture.HYBRID)


def measured(deployment: Deployment, kind: EngineKind, rate: float, times: int) -> LearnedState:
    """A state that saw ``times`` llama.cpp-style timings of ``rate`` prefill tokens per second."""
    state = LearnedState()
    for _ in range(times):
        usage = Usage(10_000, 50, 0, prompt_ms=10_000 / rate * 1000, predicted_ms=1000.0)
        state = learn(
            state, Outcome(deployment.backend_id, "m", kind, usage, 0.5, 2.0, 30_000, 0, True), deployment
        )
    return state


def prefill(state: LearnedState, deployment: Deployment = LLAMA) -> float:
    return state.for_deployment(deployment, EngineKind.LLAMACPP).prefill_tok_s.value


def test_alone_a_replica_routes_on_what_it_learned() -> None:
    own = measured(LLAMA, EngineKind.LLAMACPP, 2000.0, 3)
    assert merge(own, []) is own


def test_values_are_weighted_by_samples() -> None:
    one = measured(LLAMA, EngineKind.LLAMACPP, 2000.0, 1)  # within 2x of the prior (3000): learned as is
    three = measured(LLAMA, EngineKind.LLAMACPP, 3000.0, 3)
    merged = merge(one, [three])
    assert prefill(merged) == 2750.0  # (2000 * 1 + 3000 * 3) / 4
    assert merged.for_deployment(LLAMA, EngineKind.LLAMACPP).prefill_tok_s.samples == 4


def test_a_long_history_does_not_drown_a_fresh_measurement() -> None:
    """An EWMA stands for its last few samples: weights stop at MERGE_WEIGHT_CAP."""
    old = measured(LLAMA, EngineKind.LLAMACPP, 1000.0, 100)
    fresh = measured(LLAMA, EngineKind.LLAMACPP, 2000.0, MERGE_WEIGHT_CAP)
    assert prefill(merge(fresh, [old])) == 1500.0


def test_each_replica_contributes_what_only_it_measured() -> None:
    on_llama = measured(LLAMA, EngineKind.LLAMACPP, 2000.0, 2)
    on_vllm = measured(VLLM, EngineKind.VLLM, 8000.0, 2)
    merged = merge(on_llama, [on_vllm])
    assert prefill(merged) == 2000.0
    assert merged.for_deployment(VLLM, EngineKind.VLLM).prefill_tok_s.value == 8000.0
    assert merged.for_model("m").completion_tokens.samples == 4


@given(st.lists(st.tuples(st.floats(100.0, 50_000.0), st.integers(0, 30)), min_size=1, max_size=5))
def test_a_merged_value_lies_between_the_replicas_values(replicas: list[tuple[float, int]]) -> None:
    states = [measured(LLAMA, EngineKind.LLAMACPP, rate, times) for rate, times in replicas]
    values = [prefill(s) for s in states if s.deployments]
    merged = prefill(merge(states[0], states[1:]))
    if values:
        assert min(values) - 1e-6 <= merged <= max(values) + 1e-6
    else:
        assert merged == prefill(LearnedState())
