"""The cost model where it meets an engine's bounds: a vLLM prefix cache that holds so much, and the
worked example of docs/routing.md (the reuse itself: test_cost.py)."""

from __future__ import annotations

from msgspec.structs import replace

from policies import (
    Architecture,
    BackendSnapshot,
    Endpoint,
    EngineKind,
    Health,
    RequestFeatures,
)
from policies.cost import estimate
from policies.decision import Estimate
from policies.learning import LearnedState
from policies.slot_costs import Situation
from policies.slots import llama_options
from policies.types import PrefixMatch, SessionSource, SessionView, SlotLease, SlotMatch, SlotState
from tests.policies.cost_helpers import LLAMA, VLLM, features, vllm_snapshot


class TestVllmPrefixCacheHoldsSoMuch:
    """vLLM's prefix cache drops its least recently used blocks: a prefix sent long ago (more tokens
    sent there since than its KV cache holds, ``cache_tokens`` from ``vllm:cache_config_info``) is
    expected gone. On 8 vLLM replicas of the Mooncake trace, predicting every old prefix still there
    sent long prompts to "hits" that re-prefilled 50k tokens (mooncake-8vllm)."""

    DENSE = replace(VLLM, architecture=Architecture.DENSE)

    def on_vllm(self, age: int, cache_tokens: int | None = 300_000) -> Estimate:
        match = PrefixMatch(recent=20_000, recent_whole=True, recent_held=20_000, recent_age=age)
        snapshot = replace(vllm_snapshot(), cache_block=16, cache_tokens=cache_tokens)
        request = replace(features(24_000), session_key=None)
        return estimate(
            request, self.DENSE, snapshot, session=None, leases=(), learned=LearnedState(), match=match
        )

    def test_a_prefix_is_expected_while_the_cache_holds_what_was_sent_since(self) -> None:
        young, old = self.on_vllm(10_000), self.on_vllm(290_000)  # 20k of its own + what came after
        assert young.expected_cached_tokens > 15_000
        assert young.source == "prefix-cache"
        assert young.shared_prefix_tokens == 20_000  # what learning measures its reuse against
        assert (old.expected_cached_tokens, old.source, old.shared_prefix_tokens) == (0, "none", 0)
        assert old.ttft_s > young.ttft_s + 2

    def test_no_bound_reported_none_assumed(self) -> None:
        assert self.on_vllm(10_000_000, cache_tokens=None).expected_cached_tokens > 15_000


def test_the_worked_example_of_docs_routing() -> None:
    """docs/routing.md, "Worked example": C takes A's slot (RAM restore), not B's, not vLLM."""
    now = 1000.0
    llama = BackendSnapshot(
        "llama", EngineKind.LLAMACPP, Health.READY, now, (LLAMA,),
        slots=(SlotState(0, 65536, False), SlotState(1, 65536, False)), total_slots=2,
    )  # fmt: skip
    request = RequestFeatures("m", Endpoint.CHAT, 20_000, 256, True, "h:c", SessionSource.HEADER)
    session = SessionView("h:c", "llama", 0, prompt_tokens=18_000, turns=4)
    leases = (SlotLease(0, "h:a", now - 4, 30_000), SlotLease(1, "h:b", now - 40, 12_000))
    match = PrefixMatch(
        (SlotMatch(0, 6000, held=30_000), SlotMatch(1, 6000, held=12_000)),
        recent=18_000, recent_whole=True, recent_held=18_000, recent_age=42_000,
    )  # fmt: skip
    common = {
        "session": session,
        "leases": leases,
        "learned": LearnedState(),
        "now": now,
        "lease_idle_s": 600.0,
    }
    on_llama = estimate(request, LLAMA, llama, match=match, **common)  # type: ignore[arg-type]
    on_vllm = estimate(request, VLLM, vllm_snapshot(), match=PrefixMatch(), **common)  # type: ignore[arg-type]
    assert (on_llama.slot, on_llama.source, on_llama.expected_cached_tokens) == (0, "ram", 17_099)
    assert (round(on_llama.ttft_s, 2), round(on_llama.future_s, 2), round(on_llama.evict_cost_s, 2)) == (
        1.05,
        0.87,  # the RAM copy (85 ms) is this turn's only: the next turn finds C's state in the slot
        0.33,
    )
    assert round(on_llama.objective_ttft_s, 2) == 3.99  # with the margin: a decode step, 9 ms
    assert round(on_vllm.objective_ttft_s, 2) == 13.05  # 16 ms
    assert "takes slot 0 from session" in on_llama.note
    situation = Situation(llama, LLAMA, LearnedState().for_deployment(LLAMA, EngineKind.LLAMACPP), match,
                          session, leases, now, 600.0)  # fmt: skip
    b = next(option for option in llama_options(request, situation) if option.slot == 1)
    assert (b.source, b.evicts, round(b.evict_cost_s, 2)) == ("none", "h:b", 0.09)  # B restores from RAM
