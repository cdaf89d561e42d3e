"""The wait for llama-server's RAM-cache saves in a predicted TTFT (``policies.pricing.ram_saves_s``):
after each launch the server copies every idle slot whose state is not in its RAM cache yet
(``--cache-idle-slots``), and a slot taken for another prompt before it loads; the request waits.
On the H100 the 27B's first turn on its slot after another session's turns waited 0.6 s for it, which
no prediction had (issue #63: TTFT -47%)."""

from __future__ import annotations

import pytest
from msgspec.structs import replace

from backends.engine_profiles import load_profile
from policies.cost import estimate
from policies.decision import Estimate
from policies.learning import LearnedState
from policies.types import Architecture, PrefixMatch, SlotLease, SlotMatch
from tests.policies.cost_helpers import LLAMA, NOTHING, SESSION, features, llama_snapshot

TOKENS = 9000  # what the session on the slot sent last
SAVE_S = 0.5425 + TOKENS * 3.126e-05
PROFILE = load_profile("h100-llamacpp-27b-shape-q8_0-dense")
H100 = replace(
    LLAMA,
    profile=replace(PROFILE, cache=replace(PROFILE.cache, ram_save_s=0.5425, ram_save_token_s=3.126e-05)),
)
# slot 0 holds the session's 9,000 tokens, all of them this prompt's start
HELD = PrefixMatch(
    (SlotMatch(0, 9000, whole=True, held=9000), SlotMatch(1, 0)),
    recent=9000,
    recent_whole=True,
    recent_held=9000,
)


def on_llama(unsaved: tuple[bool, bool], *, own: bool, busy: tuple[bool, bool] = (False, False)) -> Estimate:
    """A turn of the session holding slot 0 (``own``) or a one-off, on two slots of which ``unsaved``
    wait to be saved."""
    snapshot = llama_snapshot(busy)
    slots = tuple(
        replace(s, unsaved=TOKENS if u else 0) for s, u in zip(snapshot.slots, unsaved, strict=True)
    )
    return estimate(
        features(),
        H100,
        replace(snapshot, slots=slots),
        session=SESSION if own else None,
        leases=(SlotLease(0, "s", 5.0, 9000),) if own else (),
        learned=LearnedState(),
        match=HELD if own else NOTHING,
        now=10.0,
        lease_idle_s=600.0,
    )


def test_a_launch_waits_for_every_idle_slot_it_saves() -> None:
    assert on_llama((False, False), own=False).saves_s == 0.0
    alone = on_llama((True, False), own=False)
    assert alone.saves_s == pytest.approx(SAVE_S)
    assert on_llama((True, True), own=False).saves_s == pytest.approx(2 * SAVE_S)
    assert alone.ttft_s == pytest.approx(on_llama((False, False), own=False).ttft_s + SAVE_S)


def test_a_session_continuing_its_slot_does_not_save_it_but_waits_for_the_other() -> None:
    mine = on_llama((True, False), own=True)
    assert (mine.slot, mine.source, mine.saves_s) == (0, "slot", 0.0)
    assert on_llama((False, True), own=True).saves_s == pytest.approx(SAVE_S)


def test_a_prompt_that_keeps_less_than_half_of_its_slot_saves_it_first() -> None:
    """llama-server saves a named slot before it takes it for a prompt that shares at most 10% of the
    prompt or keeps less than half of the slot (``slot_rules.consults_ram``): a compacted session's
    own slot is saved too."""
    compacted = PrefixMatch((SlotMatch(0, 2000, held=9000), SlotMatch(1, 0)), recent=2000, recent_held=9000)
    snapshot = llama_snapshot()
    slots = (replace(snapshot.slots[0], unsaved=TOKENS), snapshot.slots[1])
    got = estimate(features(), H100, replace(snapshot, slots=slots), session=SESSION,
                   leases=(SlotLease(0, "s", 5.0, 9000),), learned=LearnedState(), match=compacted, now=10.0,
                   lease_idle_s=600.0)  # fmt: skip
    assert got.slot == 0
    assert got.saves_s == pytest.approx(SAVE_S)


def test_a_busy_slot_is_not_saved_and_an_unmeasured_profile_waits_for_nothing() -> None:
    assert on_llama((True, True), own=False, busy=(True, False)).saves_s == pytest.approx(SAVE_S)
    snapshot = llama_snapshot()
    slots = tuple(replace(s, unsaved=TOKENS) for s in snapshot.slots)
    plain = estimate(features(), LLAMA, replace(snapshot, slots=slots), session=None, leases=(),
                     learned=LearnedState(), match=NOTHING)  # fmt: skip
    assert plain.saves_s == 0.0


def test_a_save_counts_the_checkpoints_turnout_knows_the_slot_holds() -> None:
    """With ``ram_save_checkpoint_s`` a slot's save costs more for each context checkpoint the prefix
    index says it holds (``SlotMatch.checkpoints``): a one-off request next to a six-turn session."""
    per_checkpoint = 0.1
    profile = H100.profile
    assert profile is not None
    deployment = replace(
        H100, profile=replace(profile, cache=replace(profile.cache, ram_save_checkpoint_s=0.1))
    )
    snapshot = llama_snapshot()
    slots = (replace(snapshot.slots[0], unsaved=TOKENS), snapshot.slots[1])
    holding = PrefixMatch((SlotMatch(0, 0, held=9000, checkpoints=12), SlotMatch(1, 0)), recent=0)
    got = estimate(features(), deployment, replace(snapshot, slots=slots), session=None, leases=(),
                   learned=LearnedState(), match=holding)  # fmt: skip
    assert got.saves_s == pytest.approx(SAVE_S + 12 * per_checkpoint)  # taken or idle: it is saved


def test_a_dense_model_saves_no_checkpoints() -> None:
    """Only a hybrid model's slot keeps context checkpoints: a dense one's save is its tokens alone,
    whatever the prefix index counted."""
    profile = H100.profile
    assert profile is not None
    cache = replace(profile.cache, ram_save_checkpoint_s=0.1)
    dense = replace(H100, architecture=Architecture.DENSE, profile=replace(profile, cache=cache))
    snapshot = llama_snapshot()
    slots = (replace(snapshot.slots[0], unsaved=TOKENS), snapshot.slots[1])
    holding = PrefixMatch((SlotMatch(0, 0, held=9000, checkpoints=12), SlotMatch(1, 0)), recent=0)
    got = estimate(features(), dense, replace(snapshot, slots=slots), session=None, leases=(),
                   learned=LearnedState(), match=holding)  # fmt: skip
    assert got.saves_s == pytest.approx(SAVE_S)
