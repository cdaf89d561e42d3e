"""A session that has just used its warm slot stays there unless another slot is really cheaper.

Found on a CPU where the real-engine test ``test_anthropic_session_keeps_its_slot_and_reuse`` failed:
its tiny model answered differently there, the engine reused a little less than predicted, and the
learned ``reuse`` fell below the RAM cache's prior; the session then left its warm slot for another
session's, to "restore" the same 35 tokens from RAM.
"""

from __future__ import annotations

from msgspec.structs import replace

from policies import Architecture, BackendSnapshot, Deployment, Endpoint, EngineKind, Health, RequestFeatures
from policies.cost import estimate
from policies.decision import Estimate
from policies.learning import Ewma, LearnedState
from policies.types import PrefixMatch, SessionSource, SessionView, SlotLease, SlotMatch, SlotState

NOW = 1000.0
LLAMA = Deployment("tiny", "llama", "up", 4096, Architecture.HYBRID)
HELD = 40  # the session's last prompt, in its slot 1 and in the RAM cache
PROMPT = 60  # this turn: that prompt, the answer and a new question


def turn(learned: LearnedState, *, mine: SlotLease, other: SlotLease) -> Estimate:
    slots = (SlotState(0, 4096, False), SlotState(1, 4096, False))
    snapshot = BackendSnapshot(
        "llama", EngineKind.LLAMACPP, Health.READY, NOW, (LLAMA,), slots=slots, total_slots=2
    )
    match = PrefixMatch(
        slots=(
            SlotMatch(mine.slot, HELD, whole=True, held=HELD),
            SlotMatch(other.slot, 0, held=other.tokens),
        ),
        recent=HELD,
        recent_whole=True,
        recent_held=HELD,
        recent_age=other.tokens,
    )
    return estimate(
        RequestFeatures("tiny", Endpoint.CHAT, PROMPT, 6, False, "h:claude", SessionSource.HEADER),
        LLAMA,
        snapshot,
        session=SessionView("h:claude", backend_id="llama", slot=mine.slot, turns=2, prompt_tokens=HELD),
        leases=(mine, other),
        learned=learned,
        match=match,
        now=NOW,
        lease_idle_s=600.0,
    )


def learned_reuse(ratio: float) -> LearnedState:
    prior = LearnedState().for_deployment(LLAMA, EngineKind.LLAMACPP)
    stats = replace(prior, reuse=Ewma(ratio, prior.reuse.prior, samples=3, ratio=True))
    return LearnedState(deployments={"llama/tiny": stats})


def test_a_restore_from_ram_never_looks_better_than_the_slot_holding_the_same_state() -> None:
    mine, other = SlotLease(1, "h:claude", NOW - 0.5, HELD), SlotLease(0, "h:other", NOW - 4, 30)
    for ratio in (0.6, 0.8, 0.97, 1.2):
        chosen = turn(learned_reuse(ratio), mine=mine, other=other)
        assert (chosen.slot, chosen.warm, chosen.evicts) == (1, True, None), ratio


def test_a_tie_keeps_the_session_on_its_own_slot() -> None:
    """The session starts a new conversation under its name: neither slot holds any of it and the
    other slot is free, so both cost the same. It stays on its own slot, though that is the one used
    last, instead of moving to the least recently used one and giving up its lease for nothing."""
    slots = (SlotState(0, 4096, False), SlotState(1, 4096, False))
    snapshot = BackendSnapshot(
        "llama", EngineKind.LLAMACPP, Health.READY, NOW, (LLAMA,), slots=slots, total_slots=2
    )
    chosen = estimate(
        RequestFeatures("tiny", Endpoint.CHAT, PROMPT, 6, False, "h:claude", SessionSource.HEADER),
        LLAMA,
        snapshot,
        session=SessionView("h:claude", backend_id="llama", slot=1, turns=2, prompt_tokens=HELD),
        leases=(SlotLease(1, "h:claude", NOW - 0.5, HELD),),
        learned=LearnedState(),
        match=PrefixMatch(slots=(SlotMatch(1, 0, held=HELD),)),
        now=NOW,
        lease_idle_s=600.0,
    )
    assert chosen.slot == 1
