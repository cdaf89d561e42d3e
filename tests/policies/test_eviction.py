"""What taking a slot costs the session holding it: the holder comes back to find the evictor's
prompt in the slot, and llama-server reuses the slot as it is, or loads from its RAM cache, by how
much the two share from the holder's side (``policies.slot_costs.eviction``)."""

from __future__ import annotations

import pytest
from msgspec.structs import replace

from backends.engine_profiles import load_profile
from policies import Architecture, BackendSnapshot, Deployment, Endpoint, EngineKind, Health, RequestFeatures
from policies.cost import estimate
from policies.decision import Estimate
from policies.learning import LearnedState
from policies.types import PrefixMatch, SessionSource, SessionView, SlotLease, SlotMatch, SlotState

SYSTEM = 2048  # a system prompt the agents and the chat share
AGENT = 11_000  # each agent's conversation, held in its slot
CHAT = 3000  # the newcomer's prompt: the system prompt and a short question
NOW = 100.0


def deployment(architecture: Architecture) -> Deployment:
    return Deployment("m", "llama", "up", 65536, architecture)


def on_llama(
    architecture: Architecture, slots: tuple[SlotMatch, ...], leases: tuple[SlotLease, ...]
) -> Estimate:
    """A named chat session's first turn on a llama.cpp backend whose slots all hold agents."""
    served = deployment(architecture)
    states = tuple(SlotState(match.slot, 65536, False) for match in slots)
    snapshot = BackendSnapshot(
        "llama", EngineKind.LLAMACPP, Health.READY, NOW, (served,), slots=states, total_slots=len(states)
    )
    return estimate(
        RequestFeatures("m", Endpoint.CHAT, CHAT, 100, True, "chat", SessionSource.HEADER),
        served,
        snapshot,
        session=SessionView("chat"),
        leases=leases,
        learned=LearnedState(),
        match=PrefixMatch(slots),
        now=NOW,
        lease_idle_s=600.0,
    )


SHARING = SlotMatch(0, SYSTEM, held=AGENT)  # agent a's conversation starts with the system prompt
APART = SlotMatch(1, 0, held=AGENT)  # agent b's has a prompt of its own


def test_a_prompt_sharing_the_holders_system_prompt_costs_it_everything_on_a_hybrid_model() -> None:
    """Back in its slot, agent a finds the chat's 3000 tokens, 2048 of them its own: sharing more
    than half of what the slot holds, llama-server reuses the slot as it is, not a's state in the
    RAM cache; a hybrid slot can give back only a checkpoint, none of which lies in the system
    prompt, so a re-prefills all 11k tokens. Agent b, sharing nothing, gets its state back from RAM:
    the chat takes b's slot although a's has been idle longer (before this, turnout judged it from
    the chat's side, where 2048 of 11k is little, and priced both as a RAM restore: a mixed
    benchmark agent then re-prefilled 11k tokens, 10.6 s, after a chat took its slot)."""
    leases = (SlotLease(0, "a", NOW - 6, AGENT), SlotLease(1, "b", NOW - 5, AGENT))
    both = on_llama(Architecture.HYBRID, (SHARING, APART), leases)
    assert (both.slot, both.evicts) == (1, "b")
    only_a = on_llama(Architecture.HYBRID, (SHARING,), leases[:1])
    only_b = on_llama(
        Architecture.HYBRID, (SlotMatch(0, 0, held=AGENT),), (SlotLease(0, "b", NOW - 5, AGENT),)
    )
    assert (only_a.evicts, only_b.evicts) == ("a", "b")
    assert only_a.evict_cost_s > 3 * only_b.evict_cost_s


def test_a_dense_slot_gives_the_holder_back_what_the_two_prompts_share() -> None:
    """A dense (or MoE) model reuses any shared prefix: the holder keeps the system prompt and
    re-prefills the rest, less than a hybrid holder loses, more than a RAM restore costs."""
    leases = (SlotLease(0, "a", NOW - 6, AGENT),)
    dense = on_llama(Architecture.DENSE, (SHARING,), leases)
    hybrid = on_llama(Architecture.HYBRID, (SHARING,), leases)
    apart = on_llama(Architecture.DENSE, (SlotMatch(0, 0, held=AGENT),), leases)
    assert apart.evict_cost_s < dense.evict_cost_s < hybrid.evict_cost_s


@pytest.mark.parametrize("architecture", [Architecture.HYBRID, Architecture.DENSE])
def test_a_prompt_sharing_little_of_the_slot_leaves_the_holder_its_ram_cache(
    architecture: Architecture,
) -> None:
    """The chat shares 2048 of its 3000 tokens with a 30k conversation it evicts: from the holder's
    side that is 7%, at most the similarity threshold, so llama-server loads its state from RAM."""
    big = 30_000
    leases = (SlotLease(0, "a", NOW - 6, big),)
    sharing = on_llama(architecture, (SlotMatch(0, SYSTEM, held=big),), leases)
    apart = on_llama(architecture, (SlotMatch(0, 0, held=big),), leases)
    assert sharing.evicts == "a"
    assert sharing.evict_cost_s == pytest.approx(apart.evict_cost_s)


def test_a_hybrid_holder_gets_back_the_checkpoint_the_newcomer_restored() -> None:
    """Slot 0 holds a checkpoint at 1713, inside the system prompt: the chat restores it (the engine
    keeps the checkpoints at or below what it reused), and agent a, coming back, restores it too:
    it re-prefills 1713 tokens fewer than with no checkpoint there."""
    leases = (SlotLease(0, "a", NOW - 6, AGENT),)
    bare = on_llama(Architecture.HYBRID, (SHARING,), leases)
    kept = on_llama(Architecture.HYBRID, (SlotMatch(0, SYSTEM, held=AGENT, checkpoint=1713),), leases)
    assert kept.expected_cached_tokens > 0
    assert 0 < kept.evict_cost_s < bare.evict_cost_s


def test_a_hybrid_holder_sharing_the_newcomers_prompt_to_its_end_gets_its_near_end_checkpoint() -> None:
    """The chat's 3000 tokens share 2600 with agent a's conversation: the chat leaves a checkpoint at
    3000 - 516 = 2484, inside what they share, and a restores it; sharing 2048, a gets nothing."""
    leases = (SlotLease(0, "a", NOW - 6, AGENT),)
    far = on_llama(Architecture.HYBRID, (SHARING,), leases)
    near = on_llama(Architecture.HYBRID, (SlotMatch(0, 2600, held=AGENT),), leases)
    assert 0 < near.evict_cost_s < far.evict_cost_s


def test_the_holders_loss_is_its_tokens_not_the_checkpoints_its_turn_takes_anyway() -> None:
    """On a profile that prices the context checkpoints a prompt takes (the H100's 27B: 0.12 s each),
    the holder's loss is the tokens it must process again: its next turn takes its checkpoints
    whether the slot was kept or not. The newcomer's own prompt pays its own."""
    profile = load_profile("h100-llamacpp-27b-shape-q8_0-dense")
    free = replace(profile, prefill=replace(profile.prefill, checkpoint_s=0.0))
    leases = (SlotLease(0, "a", NOW - 6, AGENT), SlotLease(1, "b", NOW - 5, AGENT))

    def priced(p: object) -> Estimate:
        served = Deployment("m", "llama", "up", 65536, Architecture.HYBRID, profile=p)  # type: ignore[arg-type]
        states = (SlotState(0, 65536, False), SlotState(1, 65536, False))
        snapshot = BackendSnapshot("llama", EngineKind.LLAMACPP, Health.READY, NOW, (served,), slots=states,
                                   total_slots=2)  # fmt: skip
        return estimate(
            RequestFeatures("m", Endpoint.CHAT, CHAT, 100, True, "chat", SessionSource.HEADER),
            served, snapshot, session=SessionView("chat"), leases=leases, learned=LearnedState(),
            match=PrefixMatch((SHARING, APART)), now=NOW, lease_idle_s=600.0,
        )  # fmt: skip

    paying, not_paying = priced(profile), priced(free)
    assert paying.evicts == not_paying.evicts is not None
    assert paying.evict_cost_s == pytest.approx(not_paying.evict_cost_s)
    assert paying.prefill_s - not_paying.prefill_s == pytest.approx(2 * profile.prefill.checkpoint_s)
