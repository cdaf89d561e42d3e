"""The cost model: expected reuse per engine semantics, slot choice, and monotone predictions."""

from __future__ import annotations

from dataclasses import replace

from hypothesis import given
from hypothesis import strategies as st

from policies import Architecture, BackendSnapshot, Deployment, Endpoint, EngineKind, Health, RequestFeatures
from policies.cost import estimate
from policies.learning import LearnedState, learn
from policies.types import Outcome, SessionSource, SessionView, SlotLease, SlotState, Usage

LLAMA = Deployment("m", "llama", "up", 65536, Architecture.HYBRID)
VLLM = Deployment("m", "vllm", "up", 94000, Architecture.HYBRID)


def llama_snapshot(busy: tuple[bool, ...] = (False, False), queued: int = 0) -> BackendSnapshot:
    slots = tuple(SlotState(i, 32768, b) for i, b in enumerate(busy))
    return BackendSnapshot(
        "llama",
        EngineKind.LLAMACPP,
        Health.READY,
        0.0,
        (LLAMA,),
        running=sum(busy),
        queued=queued,
        slots=slots,
        total_slots=len(busy),
    )


def vllm_snapshot(running: int = 0, queued: int = 0) -> BackendSnapshot:
    return BackendSnapshot(
        "vllm", EngineKind.VLLM, Health.READY, 0.0, (VLLM,), running=running, queued=queued
    )


def features(prompt: int = 10_000, source: SessionSource = SessionSource.HEADER) -> RequestFeatures:
    return RequestFeatures("m", Endpoint.CHAT, prompt, 100, True, "s", source)


SESSION = SessionView("s", "llama", 0, prompt_tokens=9000, turns=3, sent=(("llama", 9000), ("vllm", 9000)))


class TestReuse:
    def test_warm_pinned_slot_reuses_the_conversation(self) -> None:
        leases = (SlotLease(0, "s", 1.0),)
        result = estimate(
            features(), LLAMA, llama_snapshot(), session=SESSION, leases=leases, learned=LearnedState()
        )
        assert (result.slot, result.warm) == (0, True)
        assert result.expected_cached_tokens == round((9000 - 1) * 0.97)

    def test_slot_held_by_another_session_gives_nothing(self) -> None:
        leases = (SlotLease(0, "other", 1.0), SlotLease(1, "third", 2.0))
        result = estimate(
            features(), LLAMA, llama_snapshot(), session=SESSION, leases=leases, learned=LearnedState()
        )
        assert result.expected_cached_tokens == 0
        assert (result.slot, result.evicts) == (0, "other")  # the least recently used lease
        assert "slot was lost" in result.note

    def test_free_slot_before_eviction(self) -> None:
        leases = (SlotLease(0, "other", 1.0),)
        result = estimate(
            features(), LLAMA, llama_snapshot(), session=SESSION, leases=leases, learned=LearnedState()
        )
        assert (result.slot, result.evicts) == (1, None)

    def test_unproven_implicit_session_takes_no_slot_from_anyone(self) -> None:
        new = SessionView("s")
        leases = (SlotLease(0, "a", 1.0), SlotLease(1, "b", 2.0))
        result = estimate(
            features(source=SessionSource.IMPLICIT),
            LLAMA,
            llama_snapshot(),
            session=new,
            leases=leases,
            learned=LearnedState(),
        )
        assert (result.slot, result.evicts, result.horizon) == (None, None, 0.0)

    def test_vllm_hybrid_reuses_nothing_until_a_hit_is_seen(self) -> None:
        result = estimate(
            features(), VLLM, vllm_snapshot(), session=SESSION, leases=(), learned=LearnedState()
        )
        assert result.expected_cached_tokens == 0

    def test_vllm_learns_block_aligned_reuse(self) -> None:
        """After a 600-token prompt reused 512 of a 600-token history, a 1000-token history predicts 768."""
        outcome = Outcome("vllm", "m", EngineKind.VLLM, Usage(700, 8, 512), 0.1, 0.3, 2500, 600, True)
        learned = learn(LearnedState(), outcome, VLLM)
        stats = learned.for_deployment(VLLM, EngineKind.VLLM)
        assert stats.block == 512
        session = SessionView("s", sent=(("vllm", 1000),), turns=2, prompt_tokens=1000)
        result = estimate(features(1200), VLLM, vllm_snapshot(), session=session, leases=(), learned=learned)
        assert result.expected_cached_tokens == 512  # whole blocks of 1000 * (512 / 600)


def test_learning_reads_llama_timings() -> None:
    outcome = Outcome(
        "llama", "m", EngineKind.LLAMACPP, Usage(1000, 21, 900, 50.0, 200.0), 0.06, 0.3, 3600, 0, True
    )
    stats = learn(LearnedState(), outcome, LLAMA).for_deployment(LLAMA, EngineKind.LLAMACPP)
    assert stats.prefill_tok_s.value == 100 / 0.05
    assert stats.decode_tok_s.value == 20 / 0.2


def test_learning_ignores_nonsense() -> None:
    outcome = Outcome(
        "llama", "m", EngineKind.LLAMACPP, Usage(1000, 21, 0, 1e-9, 200.0), 0.06, 0.3, 0, 0, True
    )
    stats = learn(LearnedState(), outcome, LLAMA).for_deployment(LLAMA, EngineKind.LLAMACPP)
    assert stats.prefill_tok_s.value <= 3000 * 50  # clamped to the prior's spread


@given(st.integers(0, 20), st.integers(0, 20), st.integers(1, 100_000))
def test_cost_monotone_in_queue(queued: int, extra: int, prompt: int) -> None:
    learned = LearnedState()
    for snapshot_of in (
        lambda q: vllm_snapshot(running=2, queued=q),
        lambda q: llama_snapshot((True, True), q),
    ):
        deployment = VLLM if snapshot_of(0).kind is EngineKind.VLLM else LLAMA
        low = estimate(
            features(prompt), deployment, snapshot_of(queued), session=None, leases=(), learned=learned
        )
        high = estimate(
            features(prompt),
            deployment,
            snapshot_of(queued + extra),
            session=None,
            leases=(),
            learned=learned,
        )
        assert high.ttft_s >= low.ttft_s
        assert high.total_s >= high.ttft_s > 0


@given(st.integers(1, 50_000), st.integers(0, 50_000))
def test_cost_monotone_in_uncached_tokens(prompt: int, more: int) -> None:
    small = estimate(features(prompt), VLLM, vllm_snapshot(), session=None, leases=(), learned=LearnedState())
    large = estimate(
        features(prompt + more), VLLM, vllm_snapshot(), session=None, leases=(), learned=LearnedState()
    )
    assert large.ttft_s >= small.ttft_s


def test_a_busy_engines_ttft_does_not_teach_its_prefill_rate() -> None:
    """Under load a TTFT measures the queue: vLLM's prefill rate is learned only when it was idle."""
    base = Outcome("vllm", "m", EngineKind.VLLM, Usage(6600, 10, 0), 10.0, 11.0, 20_000, 0, True)
    idle = learn(LearnedState(), base, VLLM).for_deployment(VLLM, EngineKind.VLLM)
    contended = replace(base, contended=True)
    busy = learn(LearnedState(), contended, VLLM).for_deployment(VLLM, EngineKind.VLLM)
    assert idle.prefill_tok_s.value == 660
    assert busy.prefill_tok_s.value == 6600  # still the prior
