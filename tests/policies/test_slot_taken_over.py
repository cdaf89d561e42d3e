"""A session's slot taken over by another session's turn no longer holds the session's prompt.

The prefix index records a prompt when its request ends; a lease moves when a request is routed.
Two sessions sharing a slot alternate: while one's turn runs (or waits) there, the index still says
the slot holds the other's previous prompt. Found on 8 llama-servers of 2 slots with two agents a
slot (issue #45, contention-32-8llama): turns waited 10 s for their "warm" slot behind the other
agent's turn and re-prefilled 20k tokens there, 12 s later than predicted.
"""

from __future__ import annotations

from policies import Architecture, BackendSnapshot, Deployment, Endpoint, EngineKind, Health, RequestFeatures
from policies.cost import estimate
from policies.decision import Estimate
from policies.learning import LearnedState
from policies.types import PrefixMatch, SessionSource, SessionView, SlotLease, SlotMatch, SlotState

NOW = 1000.0
LLAMA = Deployment("m", "llama", "up", 65536, Architecture.HYBRID)
HELD = 20_000  # session a's previous prompt, recorded in slot 0 when that turn ended
PROMPT = 22_000  # a's next turn: that prompt, the answer and a new message
BUSY_S = 3.0  # what slot 0 still needs for the turn running there


def next_turn(holder: str, *, in_ram: bool = False, other_slot: bool = True, last_slot: int = 0) -> Estimate:
    """Session a's next turn; slot 0 (a's, by the index) is leased to ``holder`` and busy for
    ``BUSY_S``; with ``other_slot``, slot 1 runs session c's turn, about to end, and holds nothing
    of the prompt."""
    slots = (SlotState(0, 65536, True, busy_s=BUSY_S), SlotState(1, 65536, True, busy_s=0.2))
    matches = (SlotMatch(0, HELD, whole=True, held=HELD), SlotMatch(1, 0, held=9000))
    leases = (SlotLease(0, holder, NOW - 0.5, 24_000), SlotLease(1, "c", NOW - 2, 9000))
    count = 2 if other_slot else 1
    snapshot = BackendSnapshot(
        "llama", EngineKind.LLAMACPP, Health.READY, NOW, (LLAMA,), slots=slots[:count], total_slots=count
    )
    match = PrefixMatch(
        slots=matches[:count],
        recent=HELD,
        recent_whole=True,
        recent_held=HELD,
        recent_age=0 if in_ram else 10_000_000,  # the RAM cache still holds it, or dropped it long ago
    )
    return estimate(
        RequestFeatures("m", Endpoint.CHAT, PROMPT, 200, True, "a", SessionSource.HEADER),
        LLAMA,
        snapshot,
        session=SessionView(
            "a", backend_id="llama", slot=last_slot, turns=3, prompt_tokens=HELD, last_seen=NOW - 1
        ),
        leases=leases[:count],
        learned=LearnedState(),
        match=match,
        now=NOW,
        lease_idle_s=600.0,
    )


def test_a_slot_still_leased_to_the_session_is_waited_for() -> None:
    """The control: slot 0 is still a's (its own turn was the last routed there), so the index is
    right, and waiting 3 s for it beats re-prefilling 22k tokens on another slot."""
    own = next_turn("a")
    assert (own.slot, own.warm) == (0, True)
    assert own.expected_cached_tokens > 0.9 * HELD


def test_a_slot_another_session_took_since_holds_nothing_of_the_prompt() -> None:
    """Slot 0 is leased to b, whose turn runs there: when a's turn gets the slot it holds b's
    prompt, not a's: the prediction is a full prefill after the wait, and the slot's loss is noted."""
    only = next_turn("b", other_slot=False)
    assert only.slot == 0
    assert only.expected_cached_tokens == 0
    assert only.ttft_s > BUSY_S + PROMPT / 6000
    assert "slot was lost: full re-prefill" in only.note


def test_the_ram_cache_is_not_counted_on_for_a_state_the_other_turn_may_have_kept_from_it() -> None:
    """llama-server saved a's state to its RAM cache only if b's turn consulted the cache (it
    reuses a slot that keeps half of what it holds as it is, dropping a's state), and a deferred
    task takes a slot the moment it frees, before idle slots are saved: turnout sees neither, so a
    RAM entry that looks young enough is not counted on (counting on it, contention-32-8llama's
    mean TTFT was 1.35x dynamo-kv's)."""
    young = next_turn("b", in_ram=True)
    assert young.expected_cached_tokens == 0
    assert "slot was lost" in young.note


def test_another_sessions_slot_holding_a_prefix_of_the_prompt_holds_it() -> None:
    """Only the slot of the session's last turn can hold its prompt without it: another session's
    slot whose index record is a prefix of this prompt holds what that session's finished request
    left there (the same prompt sent twice, a conversation forked from it), and reuses it."""
    repeated = next_turn("b", other_slot=False, last_slot=1)
    assert repeated.slot == 0
    assert repeated.expected_cached_tokens > 0.9 * HELD
