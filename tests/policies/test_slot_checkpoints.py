"""A hybrid llama.cpp slot restores the newest checkpoint it holds within the shared prefix, one an
earlier prompt left included (``policies.slots.usable``, ``checkpoints_after``), and the cost model
predicts that much reuse."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st
from msgspec.structs import replace

from backends.engine_profiles import load_profile
from backends.sim.prefix_cache import add_checkpoints
from policies import Architecture, BackendSnapshot, Deployment, Endpoint, EngineKind, Health, RequestFeatures
from policies.cost import estimate
from policies.learning import LearnedState
from policies.slot_rules import checkpoint_gap, checkpoints_after, usable
from policies.types import PrefixMatch, SessionSource, SessionView, SlotMatch, SlotState

LLAMA = Deployment("m", "llama", "up", 65536, Architecture.HYBRID)
SYSTEM = 2048  # a shared system prompt
OLD = 1713  # the checkpoint a 2229-token chat (the system prompt + 181) left: 2229 - 4 - 512


class TestUsable:
    @pytest.mark.parametrize(
        ("match", "hybrid", "expected"),
        [
            (SlotMatch(0, SYSTEM, held=3000, checkpoint=OLD), True, OLD),  # shares the system prompt only
            (SlotMatch(0, SYSTEM, held=3000), True, 0),  # no checkpoint inside it: nothing
            (SlotMatch(0, SYSTEM, held=3000, checkpoint=OLD), False, SYSTEM),  # dense: what it shares
            (SlotMatch(0, 2900, held=3000, checkpoint=OLD), True, 3000 - 516),  # the near-end one is later
            (SlotMatch(0, 3000, whole=True, held=3000, checkpoint=2996), True, 3000),  # extends: live state
        ],
    )
    def test_a_diverging_hybrid_prompt_restores_the_newest_checkpoint_it_shares(
        self, match: SlotMatch, hybrid: bool, expected: int
    ) -> None:
        assert usable(match, hybrid) == expected

    def test_a_ram_cache_entry_offers_only_its_near_end_checkpoint(self) -> None:
        """Turnout does not track a RAM entry's checkpoints: sharing its system prompt gives nothing."""
        match = PrefixMatch(recent=SYSTEM, recent_held=3000)
        assert match.best_recent.checkpoint == 0
        assert usable(match.best_recent, True) == 0


class TestCheckpointsAfter:
    @pytest.mark.parametrize(
        ("previous", "tokens", "cached"),
        [
            ((), 2229, 0),  # a first prompt: N - 516 and N - 4
            ((1713, 2225), 3000, 1713),  # restored 1713: 2225 goes, 1713 stays
            ((1713, 2225), 2500, 2229),  # a follow-up: everything stays
            ((1713, 2225), 2600, 2225),  # restored exactly at a checkpoint
            ((1713, 2225), 400, 0),  # shares nothing: all go; 400 - 516 is no position
            (tuple(range(100, 3300, 100)), 4000, 3200),  # 32 already: the oldest go
        ],
    )
    def test_it_is_the_simulators_rule(self, previous: tuple[int, ...], tokens: int, cached: int) -> None:
        """The engine keeps the checkpoints at or below what it reused, then adds the new prompt's."""
        kept = tuple(c for c in previous if c <= cached)
        assert checkpoints_after(previous, tokens, cached) == add_checkpoints(kept, tokens, cached, 516)

    @given(
        previous=st.lists(st.integers(1, 9000), max_size=40, unique=True).map(lambda p: tuple(sorted(p))),
        tokens=st.integers(1, 10_000),
        cached=st.integers(0, 10_000),
        gap=st.sampled_from((516, 2048, 4096)),
        user_start=st.integers(-1, 10_000),
    )
    def test_it_is_the_simulators_rule_at_any_gap_and_user_start(
        self, previous: tuple[int, ...], tokens: int, cached: int, gap: int, user_start: int
    ) -> None:
        cached = min(cached, tokens - 1)
        kept = tuple(c for c in previous if c <= cached)
        assert checkpoints_after(previous, tokens, cached, gap, user_start) == add_checkpoints(
            kept, tokens, cached, gap, user_start
        )

    def test_an_unknown_cached_count_keeps_only_the_new_prompts(self) -> None:
        assert checkpoints_after((1713, 2225), 3000, None) == (3000 - 516, 3000 - 4)


def features(prompt: int) -> RequestFeatures:
    return RequestFeatures("m", Endpoint.CHAT, prompt, 100, True, "s", SessionSource.HEADER)


def snapshot() -> BackendSnapshot:
    slots = (SlotState(0, 32768, False), SlotState(1, 32768, True))
    return BackendSnapshot(
        "llama", EngineKind.LLAMACPP, Health.READY, 0.0, (LLAMA,), running=1, slots=slots, total_slots=2
    )


def test_a_hybrid_slot_with_an_old_checkpoint_predicts_its_reuse() -> None:
    """Slot 0 holds another chat of 3000 tokens sharing the 2048-token system prompt, and the
    checkpoint at 1713 a short chat left there: a new chat of 2600 tokens pinned there reuses 1713
    tokens (times the learned reuse), not 0; slot 1 is busy."""
    learned = LearnedState()
    ratio = learned.for_deployment(LLAMA, EngineKind.LLAMACPP).reuse.value

    def predict(checkpoint: int) -> tuple[int, int, int | None, str]:
        slots = (SlotMatch(0, SYSTEM, held=3000, checkpoint=checkpoint), SlotMatch(1, 0))
        match = PrefixMatch(slots, recent=SYSTEM, recent_held=3000)
        result = estimate(
            features(2600), LLAMA, snapshot(), session=SessionView("s"), leases=(),
            learned=learned, match=match, now=10.0,
        )  # fmt: skip
        return result.expected_cached_tokens, result.shared_prefix_tokens, result.slot, result.source

    assert predict(OLD) == (round((OLD - 1) * ratio), OLD, 0, "slot")
    assert predict(0)[:2] == (0, 0)  # without it, as before: nothing


def test_the_near_end_checkpoint_sits_the_deployments_gap_before_the_end() -> None:
    """A prompt diverging 5 tokens before the end of the 3,000 a slot holds (a replayed trace turn:
    its chat template closed there) restores the checkpoint ``min(batch, 4 + ubatch)`` before that
    end: 516 tokens for a deployment without a profile (llama-server's default micro-batch), 2,048
    for one whose profile runs compose's ``--ubatch-size 2048``; the cost model predicts that much."""
    compose = load_profile("workstation-llamacpp-flash-next-cpu-moe")
    assert (compose.prefill.ubatch, compose.prefill.batch) == (2048, 2048)
    wide = replace(LLAMA, profile=compose)
    assert (checkpoint_gap(LLAMA), checkpoint_gap(wide)) == (516, 2048)
    learned = LearnedState()

    def predict(deployment: Deployment) -> int:
        slots = (SlotMatch(0, 2995, held=3000), SlotMatch(1, 0))
        match = PrefixMatch(slots, recent=2995, recent_held=3000)
        result = estimate(
            features(3400), deployment, snapshot(), session=SessionView("s"), leases=(),
            learned=learned, match=match, now=10.0,
        )  # fmt: skip
        assert result.slot == 0
        return result.shared_prefix_tokens

    assert (predict(LLAMA), predict(wide)) == (3000 - 516, 3000 - 2048)
