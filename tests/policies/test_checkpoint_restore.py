"""A hybrid llama.cpp slot that resumes from a context checkpoint pays the profile's
``cache.checkpoint_restore_s`` in the predicted TTFT (``policies.cost``; the engine counts it in its
``prompt_ms``), a turn that extends the slot's live state does not, and learning does not take the
restore for a slower engine. On the H100's 27B a ~400-token warm turn took 0.49 s where its tokens cost
0.36 s, and every such turn was predicted 24-29% short (issue #63)."""

from __future__ import annotations

import pytest
from msgspec.structs import replace

from backends.engine_profiles import load_profile
from policies.cost import estimate
from policies.decision import Estimate, Outcome
from policies.learning import LearnedState, learn
from policies.types import EngineKind, PrefixMatch, SlotLease, SlotMatch, Usage
from tests.policies.cost_helpers import LLAMA, SESSION, features, llama_snapshot

RESTORE_S = 0.12
PROFILE = load_profile("h100-llamacpp-27b-shape-q8_0-dense")
H100 = replace(LLAMA, profile=replace(PROFILE, cache=replace(PROFILE.cache, checkpoint_restore_s=RESTORE_S)))
PLAIN = replace(LLAMA, profile=replace(PROFILE, cache=replace(PROFILE.cache, checkpoint_restore_s=0.0)))
# slot 0 holds the session's 9,000 tokens; this prompt extends them, or leaves them 2 before the end
EXTENDS = PrefixMatch((SlotMatch(0, 9000, whole=True, held=9000), SlotMatch(1, 0)), recent=9000,
                      recent_whole=True, recent_held=9000)  # fmt: skip
DIVERGES = PrefixMatch((SlotMatch(0, 8998, held=9000, checkpoint=8996), SlotMatch(1, 0)), recent=8998,
                       recent_held=9000)  # fmt: skip


def turn(deployment: object, match: PrefixMatch, learned: LearnedState | None = None) -> Estimate:
    return estimate(
        features(9400),
        deployment,  # type: ignore[arg-type]
        llama_snapshot(),
        session=SESSION,
        leases=(SlotLease(0, "s", 5.0, 9000),),
        learned=learned or LearnedState(),
        match=match,
        now=10.0,
        lease_idle_s=600.0,
    )


def test_a_diverging_turn_pays_the_restore_and_a_continuing_one_what_is_learned_of_it() -> None:
    """A prompt that diverges inside the slot restores a checkpoint; one that continues the slot's
    last prompt restores the one before the answer unless it carries the answer token for token (the
    engine continues live): priced by the share learned to continue live (prior 0.5)."""
    diverging, continuing = turn(H100, DIVERGES), turn(H100, EXTENDS)
    assert (diverging.slot, diverging.source, continuing.slot, continuing.source) == (0, "slot", 0, "slot")
    assert (diverging.restores, diverging.continues, continuing.restores, continuing.continues) == (
        True, False, False, True,
    )  # fmt: skip
    assert diverging.checkpoint_s == RESTORE_S
    assert "slot 0 resumes from a context checkpoint" in diverging.note  # the decision log says why
    assert "checkpoint" not in continuing.note
    assert continuing.checkpoint_s == pytest.approx(RESTORE_S * 0.5)
    unmeasured = turn(PLAIN, DIVERGES)
    assert unmeasured.checkpoint_s == 0.0
    assert diverging.ttft_s - unmeasured.ttft_s == pytest.approx(RESTORE_S)


def continued(cached: int, learned: LearnedState) -> LearnedState:
    """A continuing turn (the slot held the session's 9,000 tokens) whose engine reused ``cached``
    and took what its tokens and a restore (if it restored: fewer than 9,000 reused) cost."""
    predicted = turn(H100, EXTENDS, learned)
    restore = RESTORE_S if cached < 9000 else 0.0
    prompt_ms = (PROFILE.prefill_seconds(9400 - cached, cached) + restore) * 1000
    usage = Usage(9400, 8, cached, prompt_ms=prompt_ms)
    outcome = Outcome("llama", "m", EngineKind.LLAMACPP, usage, 0.5, 0.6, 30_000, 9000, True,
                      predicted=predicted)  # fmt: skip
    return learn(learned, outcome, H100)


@pytest.mark.parametrize(("cached", "towards"), [(8996, 0.0), (9150, 1.0)])
def test_learning_follows_whether_continuing_turns_restore(cached: int, towards: float) -> None:
    """Restored (the checkpoint 4 before the last prompt's end) or continued live (the answer too):
    the share moves to it, the next continuing turn is priced by it, and the rate stays the
    profile's own either way (the restore is expected in prompt_ms only where it happened)."""
    learned = LearnedState()
    for _ in range(6):
        learned = continued(cached, learned)
    stats = learned.for_deployment(H100, EngineKind.LLAMACPP)
    assert stats.live.samples == 6
    assert abs(stats.live.value - towards) < 0.2
    assert turn(H100, EXTENDS, learned).checkpoint_s == pytest.approx(RESTORE_S * (1 - stats.live.value))
    assert stats.prefill_tok_s.value == pytest.approx(stats.prefill_tok_s.prior, rel=1e-3)


def test_learning_does_not_take_the_restore_for_a_slower_engine() -> None:
    """The engine's prompt_ms holds the restore: a turn that took exactly what was predicted teaches
    the profile's own rate (without the restore in the expectation it taught a 25% slower one)."""
    predicted = turn(H100, DIVERGES)
    prompt_ms = (predicted.prefill_s + predicted.checkpoint_s) * 1000
    cached = predicted.expected_cached_tokens
    usage = Usage(9400, 8, cached, prompt_ms=prompt_ms)
    outcome = Outcome("llama", "m", EngineKind.LLAMACPP, usage, 0.5, 0.6, 30_000, 8996, True,
                      predicted=predicted)  # fmt: skip
    learned = learn(LearnedState(), outcome, H100)
    rate = learned.for_deployment(H100, EngineKind.LLAMACPP).prefill_tok_s
    assert rate.samples == 1
    assert rate.value == pytest.approx(rate.prior, rel=1e-3)


def test_learning_adds_no_restore_where_the_engine_extended_the_slot_instead() -> None:
    """Predicted to restore, the engine reused more than the checkpoint (it loaded a state the prompt
    extends, or the answer came back token for token): its prompt_ms holds no restore, and a turn
    that took what its tokens cost teaches the profile's own rate."""
    predicted = turn(H100, DIVERGES)
    cached = 8998  # more than the 8,996 the checkpoint gives
    prompt_ms = PROFILE.prefill_seconds(9400 - cached, cached) * 1000
    usage = Usage(9400, 8, cached, prompt_ms=prompt_ms)
    outcome = Outcome("llama", "m", EngineKind.LLAMACPP, usage, 0.5, 0.6, 30_000, 8996, True,
                      predicted=predicted)  # fmt: skip
    rate = learn(LearnedState(), outcome, H100).for_deployment(H100, EngineKind.LLAMACPP).prefill_tok_s
    assert rate.value == pytest.approx(rate.prior, rel=1e-3)
