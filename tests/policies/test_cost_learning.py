"""The cost model learning from outcomes: the RAM cache's size, the queue factor (vLLM only, on
primed predictions), llama.cpp's timings, an idle engine's prefill rate, a profile's level."""

from __future__ import annotations

import pytest
from msgspec.structs import replace

from policies import (
    EngineKind,
)
from policies.cost import estimate
from policies.decision import Estimate, Outcome
from policies.learning import (
    ALPHA,
    PRIMED_SAMPLES,
    QUEUE_SPREAD,
    SPREAD,
    Ewma,
    LearnedState,
    learn,
    learn_prefill,
)
from policies.types import SlotLease, SlotState, Usage
from tests.policies.cost_helpers import (
    CPU_MOE,
    LLAMA,
    MOE,
    NO_RAM,
    NOTHING,
    VLLM,
    features,
    llama,
    llama_snapshot,
    vllm_snapshot,
)


def test_a_restore_that_never_came_shrinks_the_ram_cache() -> None:
    """No reuse where 8500 tokens were expected from RAM: the cache holds less than that entry's
    span; the slot's and the RAM's reuse ratios stay what they were."""
    stats = NO_RAM.for_deployment(LLAMA, EngineKind.LLAMACPP)
    assert stats.ram_tokens.value == 9000 * 0.5
    assert (stats.reuse.value, stats.ram_reuse.value) == (0.97, 0.95)


def test_a_restore_that_came_grows_the_ram_cache() -> None:
    outcome = Outcome(
        "llama", "m", EngineKind.LLAMACPP, Usage(300_000, 8, 280_000), 1.0, 2.0, 0, 290_000, True,
        predicted=Estimate(0, 0.0, 0.0, 0.0, source="ram", ram_tokens=270_000, ram_span=400_000),
    )  # fmt: skip
    stats = learn(LearnedState(), outcome, LLAMA).for_deployment(LLAMA, EngineKind.LLAMACPP)
    assert stats.ram_tokens.value == 400_000
    assert stats.ram_reuse.value > 0.9


def test_a_queue_longer_than_predicted_teaches_the_queue_factor() -> None:
    """Predicted 1 s of queue (of 1.5 s TTFT) on vLLM and waited 3 s, again and again: later queues
    count three times there. A llama.cpp slot's queue is modelled whole and teaches nothing (its
    waits spread with the unknown answers ahead; a factor learned there scaled every later wait up)."""
    predicted = Estimate(0, queue_s=1.0, ttft_s=1.5, total_s=2.0, modelled_queue_s=1.0, primed=True)
    outcome = Outcome(
        "vllm", "m", EngineKind.VLLM, Usage(1000, 8, 0), 3.5, 4.0, 0, 0, True, predicted=predicted
    )
    learned = learn(LearnedState(), outcome, VLLM)
    assert learned.for_deployment(VLLM, EngineKind.VLLM).queue_factor.value == pytest.approx(3.0**ALPHA)
    for _ in range(30):
        learned = learn(learned, outcome, VLLM)
    assert learned.for_deployment(VLLM, EngineKind.VLLM).queue_factor.value == pytest.approx(3.0, rel=1e-3)
    queued = estimate(
        features(), VLLM, vllm_snapshot(running=4, queued=2), session=None, leases=(), learned=learned
    )
    assert queued.queue_s == pytest.approx(3.0 * queued.modelled_queue_s, rel=1e-3)
    on_llama = replace(outcome, backend_id="llama", kind=EngineKind.LLAMACPP)
    stats = learn(LearnedState(), on_llama, LLAMA).for_deployment(LLAMA, EngineKind.LLAMACPP)
    assert stats.queue_factor.samples == 0


def test_one_odd_sample_does_not_set_the_queue_factor() -> None:
    """The first token came before the predicted prefill was done (0.65 s where 0.75 s of prefill
    followed 0.89 s of predicted backlog): the sample is below 0, the factor's floor. It moves the
    factor by ALPHA in log space, as any later sample would, not to the floor: set to 0.1, every vLLM
    queue counted a tenth until the next sample, and under load that came seconds of congestion
    later (the chat workload's draw 36: 1.31x llm-d's mean TTFT)."""
    predicted = Estimate(0, queue_s=0.894, ttft_s=1.644, total_s=3.0, modelled_queue_s=0.894, primed=True)
    outcome = Outcome(
        "vllm", "m", EngineKind.VLLM, Usage(3000, 8, 0), 0.653, 3.0, 0, 0, True, predicted=predicted
    )
    factor = learn(LearnedState(), outcome, VLLM).for_deployment(VLLM, EngineKind.VLLM).queue_factor
    assert factor.samples == 1
    assert factor.value == pytest.approx((1 / QUEUE_SPREAD) ** ALPHA)  # ~0.5


def test_a_llama_queue_is_not_scaled_by_a_factor_learned_before() -> None:
    """A state store may still hold a llama.cpp queue factor learned by an older turnout: it is not
    applied (the slot's queue is its requests' chain plus the prefill backlog, as predicted)."""
    prior = LearnedState().for_deployment(LLAMA, EngineKind.LLAMACPP)
    stale = LearnedState(deployments={"llama/m": replace(prior, queue_factor=Ewma(2.8, 1.0, 9))})
    snapshot = replace(
        llama_snapshot((True, True)), slots=(SlotState(0, 32768, True, 1.0), SlotState(1, 32768, True, 2.0))
    )
    result = llama(leases=(SlotLease(0, "s", 1.0, 9000),), snapshot=snapshot, learned=stale)
    assert result.modelled_queue_s > 0
    assert result.queue_s == result.modelled_queue_s


def test_a_queue_shorter_than_the_prefill_teaches_nothing() -> None:
    """0.08 s of backlog predicted before 0.11 s of prefill, and the first token came at 0.08 s: the
    prefill was faster than predicted; read as a queue it would say queues are a tenth of what is
    modelled (and it did, in the chat replay: a burst then queued on llama.cpp's slots)."""
    outcome = Outcome(
        "llama", "m", EngineKind.LLAMACPP, Usage(4000, 8, 0), 0.08, 0.5, 0, 0, True,
        predicted=Estimate(0, queue_s=0.08, ttft_s=0.19, total_s=0.3, modelled_queue_s=0.08, primed=True),
    )  # fmt: skip
    stats = learn(LearnedState(), outcome, LLAMA).for_deployment(LLAMA, EngineKind.LLAMACPP)
    assert stats.queue_factor.samples == 0


def test_a_queue_predicted_on_priors_teaches_nothing() -> None:
    """A burst at start-up, predicted on the priors (20x off in a replay's compressed time): the
    queues were far shorter than predicted, which says how wrong the priors were, not how the queue
    model errs. Scaling later queues by it sent a burst of one-off requests to a llama.cpp slot
    predicted ~10x shorter than it was (the chat replay, 4 runs in 8)."""
    outcome = Outcome(
        "llama", "m", EngineKind.LLAMACPP, Usage(1000, 8, 0), 0.6, 1.0, 0, 0, True,
        predicted=Estimate(0, queue_s=5.0, ttft_s=5.5, total_s=6.0, modelled_queue_s=5.0),
    )  # fmt: skip
    learned = learn(LearnedState(), outcome, LLAMA)
    assert learned.for_deployment(LLAMA, EngineKind.LLAMACPP).queue_factor.samples == 0
    for _ in range(PRIMED_SAMPLES - 1):
        learned = learn(learned, outcome, LLAMA)
    stats = learned.for_deployment(LLAMA, EngineKind.LLAMACPP)
    assert stats.primed
    result = estimate(
        features(1000), LLAMA, llama_snapshot((True, True)), session=None, leases=(), learned=learned
    )
    assert result.primed  # predictions from now on teach it


def test_learning_reads_llama_timings() -> None:
    outcome = Outcome(
        "llama", "m", EngineKind.LLAMACPP, Usage(1000, 21, 900, 50.0, 200.0), 0.06, 0.3, 3600, 0, True
    )
    stats = learn(LearnedState(), outcome, LLAMA).for_deployment(LLAMA, EngineKind.LLAMACPP)
    assert stats.prefill_tok_s.value == 100 / 0.05
    assert stats.decode_tok_s.value == 20 / 0.2


def test_llama_timings_shared_with_a_warm_up_do_not_teach_the_prefill_rate() -> None:
    """llama-server batches a warm-up's prompt with the request's (``policies.warm``): its
    ``prompt_ms`` spans both (issue #45: one such sample taught a quarter of the engine's rate)."""
    outcome = Outcome(
        "llama", "m", EngineKind.LLAMACPP, Usage(1000, 21, 900, 50.0, 200.0), 0.06, 0.3, 3600, 0, True
    )
    shared = learn(LearnedState(), replace(outcome, shared_prefill=True), LLAMA)
    stats = shared.for_deployment(LLAMA, EngineKind.LLAMACPP)
    assert stats.prefill_tok_s.value == 3000  # still the prior
    assert stats.decode_tok_s.value == 20 / 0.2  # its decode steps were its own


def test_a_warm_up_teaches_the_prefill_rate_and_nothing_else() -> None:
    """``learn_prefill``: a warm-up's one-token answer and its duration say nothing of the model's
    answers or the engine's service time; its prompt, processed alone, says how fast it prefills."""
    outcome = Outcome(
        "llama", "m", EngineKind.LLAMACPP, Usage(8000, 1, 0, 4000.0, 0.0), None, 4.0, 0, 0, stream=False
    )
    state = learn_prefill(LearnedState(), outcome, LLAMA)
    stats = state.for_deployment(LLAMA, EngineKind.LLAMACPP)
    prior = LearnedState().for_deployment(LLAMA, EngineKind.LLAMACPP)
    assert stats.prefill_tok_s.value == 8000 / 4.0
    assert (stats.decode_tok_s, stats.service_s, stats.reuse) == (
        prior.decode_tok_s,
        prior.service_s,
        prior.reuse,
    )
    assert state.models == LearnedState().models  # no answer length, no chars per token
    shared = learn_prefill(LearnedState(), replace(outcome, shared_prefill=True), LLAMA)
    assert shared == LearnedState()


def test_learning_ignores_nonsense() -> None:
    outcome = Outcome(
        "llama", "m", EngineKind.LLAMACPP, Usage(1000, 21, 0, 1e-9, 200.0), 0.06, 0.3, 0, 0, True
    )
    stats = learn(LearnedState(), outcome, LLAMA).for_deployment(LLAMA, EngineKind.LLAMACPP)
    assert stats.prefill_tok_s.value <= 3000 * SPREAD  # clamped to the prior's spread


def test_a_busy_engines_ttft_does_not_teach_its_prefill_rate() -> None:
    """Under load a TTFT measures the queue: vLLM's prefill rate is learned only when it was idle."""
    base = Outcome("vllm", "m", EngineKind.VLLM, Usage(6600, 10, 0), 2.0, 3.0, 20_000, 0, True)
    idle = learn(LearnedState(), base, VLLM).for_deployment(VLLM, EngineKind.VLLM)
    contended = replace(base, contended=True)
    busy = learn(LearnedState(), contended, VLLM).for_deployment(VLLM, EngineKind.VLLM)
    assert idle.prefill_tok_s.value == 3300
    assert busy.prefill_tok_s.value == 6600  # still the prior


def test_learning_corrects_a_profiles_level_and_keeps_its_shape() -> None:
    """An engine twice as slow as its profile, measured on a short turn, is believed twice as slow on a
    long prompt too (a per-token rate would have learned the short turn's batch cost as a rate)."""
    slow = CPU_MOE.prefill_seconds(500, 9000) * 2
    outcome = Outcome(
        "llama", "m", EngineKind.LLAMACPP, Usage(9500, 21, 9000, slow * 1000, 200.0), 0.06, 0.3, 0, 0, True
    )
    learned = learn(LearnedState(), outcome, MOE)
    stats = learned.for_deployment(MOE, EngineKind.LLAMACPP)
    assert stats.prefill_tok_s.prior == pytest.approx(CPU_MOE.prefill_tok_s())
    assert stats.prefill_tok_s.value == pytest.approx(CPU_MOE.prefill_tok_s() / 2)
    cold = estimate(
        features(4096), MOE, llama_snapshot(), session=None, leases=(), learned=learned, match=NOTHING
    )
    assert cold.prefill_s == pytest.approx(2 * CPU_MOE.prefill_seconds(4096))
