"""The cost model: expected reuse per engine semantics and slot choice (what it learns:
test_cost_learning.py; its predicted times and a pin's look-ahead: test_cost_pricing.py)."""

from __future__ import annotations

import pytest
from msgspec.structs import replace

from backends.engine_profiles import load_profile
from policies import (
    EngineKind,
)
from policies.cost import estimate
from policies.decision import Outcome
from policies.learning import LearnedState, learn
from policies.pricing import prefill_s
from policies.sessions import session_label
from policies.slot_costs import Situation
from policies.slots import llama_options
from policies.types import PrefixMatch, SessionSource, SessionView, SlotLease, SlotMatch, SlotState, Usage
from tests.policies.cost_helpers import (
    HELD,
    LLAMA,
    NO_RAM,
    NOTHING,
    SESSION,
    VLLM,
    features,
    llama,
    llama_snapshot,
    vllm_snapshot,
)


class TestReuse:
    def test_warm_pinned_slot_reuses_the_conversation(self) -> None:
        result = llama(leases=(SlotLease(0, "s", 1.0, 9000),))
        assert (result.slot, result.warm, result.source) == (0, True, "slot")
        assert result.expected_cached_tokens == round((9000 - 1) * 0.97)

    def test_lost_slot_restores_from_the_ram_cache(self) -> None:
        """Another session took the slot: llama-server loads the saved state back from RAM."""
        match = PrefixMatch(
            (SlotMatch(0, 0), SlotMatch(1, 0)), recent=9000, recent_whole=True, recent_held=9000
        )
        result = llama(match, (SlotLease(0, "other", 1.0, 500), SlotLease(1, "third", 2.0, 500)))
        assert result.source == "ram"
        assert result.expected_cached_tokens == round(8999 * 0.95)
        assert "slot was lost: restore from the RAM cache" in result.note

    def test_a_prompt_still_in_its_slot_is_not_in_the_ram_cache(self) -> None:
        """llama-server saves a slot's state to RAM once the slot is idle and a task starts
        elsewhere: while the slot still processes the prompt (a warm-up's, ``policies.warm``),
        another slot cannot restore it (issue #45: a session's next turn went to the other slot for
        a RAM restore of its own warm-up in progress, and prefilled cold)."""
        match = PrefixMatch(
            (SlotMatch(0, 9000, whole=True, held=9000), SlotMatch(1, 0)),
            recent=9000,
            recent_whole=True,
            recent_held=9000,
        )
        busy = replace(
            llama_snapshot((True, False)), slots=(SlotState(0, 32768, True, 2.0), SlotState(1, 32768, False))
        )
        leases = (SlotLease(0, "s", 9.0, 9000),)
        waits = llama(match, leases, snapshot=busy)
        assert (waits.slot, waits.source) == (0, "slot")  # its own slot, once the prompt is in
        taken = PrefixMatch(  # slot 0 went on to another prompt: the session's state was saved
            (SlotMatch(0, 0, held=4000), SlotMatch(1, 0)), recent=9000, recent_whole=True, recent_held=9000
        )
        restored = llama(taken, (SlotLease(0, "other", 9.0, 4000),), snapshot=busy)
        assert (restored.slot, restored.source) == (1, "ram")

    def test_lost_slot_without_ram_cache_re_prefills(self) -> None:
        """Once the server showed it has no RAM cache (--cache-ram 0), nothing is expected from it."""
        match = PrefixMatch(
            (SlotMatch(0, 0), SlotMatch(1, 0)), recent=9000, recent_whole=True, recent_held=9000
        )
        leases = (SlotLease(0, "other", 1.0, 500), SlotLease(1, "third", 2.0, 500))
        result = llama(match, leases, learned=NO_RAM)
        assert result.expected_cached_tokens < 9000 * 0.05
        assert "slot was lost: full re-prefill" in result.note

    def test_free_slot_before_eviction(self) -> None:
        result = llama(NOTHING, (SlotLease(0, "other", 9.0, 5000),))
        assert (result.slot, result.evicts, result.evict_cost_s) == (1, None, 0.0)

    def test_eviction_takes_the_cheapest_slot_and_counts_its_cost(self) -> None:
        """Without a RAM cache, the victim is the session that loses least, not the least recent."""
        leases = (SlotLease(0, "big", 5.0, 40_000), SlotLease(1, "small", 9.0, 2000))
        result = llama(NOTHING, leases, learned=NO_RAM)
        assert (result.slot, result.evicts) == (1, "small")
        assert result.evict_cost_s > 0
        assert "takes slot 1 from session" in result.note

    def test_expired_lease_is_free(self) -> None:
        """A lease idle for lease_idle_s costs nothing to take, and the note says why."""
        leases = (SlotLease(0, "old", 0.0, 40_000), SlotLease(1, "new", 900.0, 40_000))
        result = llama(NOTHING, leases, learned=NO_RAM, now=1000.0)
        # the claim compares and sets against the old holder: its lease is taken, at no cost
        assert (result.slot, result.evicts, result.evict_cost_s) == (0, "old", 0.0)
        assert f"takes slot 0: session {session_label('old')}'s lease expired" in result.note

    def test_a_lease_that_has_not_expired_is_never_called_expired(self) -> None:
        """A holder that loses nothing (it holds no tokens) costs nothing to evict, 4 s after its
        last turn: it is evicted, not expired (the note used to say "expired" whenever the cost was 0)."""
        leases = (SlotLease(0, "idle", 996.0, 0), SlotLease(1, "new", 999.0, 40_000))
        result = llama(NOTHING, leases, learned=NO_RAM, now=1000.0)
        assert (result.slot, result.evicts, result.evict_cost_s) == (0, "idle", 0.0)
        assert "expired" not in result.note
        assert f"takes slot 0 from session {session_label('idle')} (+0.00 s next turn)" in result.note

    def test_busy_own_slot_waits_what_its_request_still_needs(self) -> None:
        """Waiting 0.1 s beats re-prefilling 9000 tokens elsewhere (no RAM cache to restore from)."""
        snapshot = replace(
            llama_snapshot((True, False)), slots=(SlotState(0, 32768, True, 0.1), SlotState(1, 32768, False))
        )
        result = llama(leases=(SlotLease(0, "s", 1.0, 9000),), snapshot=snapshot, learned=NO_RAM)
        assert (result.slot, result.queue_s) == (0, 0.1)
        assert "waits ~0.1 s for slot 0" in result.note

    def test_own_slot_busy_with_the_sessions_last_turn_is_idle(self) -> None:
        """The probe (at 0.0) saw slot 0 busy; the session's last turn ended after it (at 1.0), on
        another replica, say: that turn was the work it saw, and the warm slot is free."""
        busy = llama_snapshot((True, False))
        ended_since = replace(SESSION, last_seen=1.0)
        result = llama(leases=(SlotLease(0, "s", 1.0, 9000),), snapshot=busy, session=ended_since)
        assert (result.slot, result.warm, result.queue_s) == (0, True, 0.0)
        assert "waits" not in result.note

    def test_own_slot_busy_with_something_else_waits(self) -> None:
        """Seen busy after the session's last turn ended, or running a request of this replica's:
        the slot is busy with something else, and waiting for it is predicted (or another slot
        re-prefills, whichever is cheaper), never a free warm slot."""
        lease = (SlotLease(0, "s", 1.0, 9000),)
        probed_later = replace(llama_snapshot((True, False)), taken_at=2.0)
        ours_there = replace(
            llama_snapshot((True, False)), slots=(SlotState(0, 32768, True, 0.5), SlotState(1, 32768, False))
        )
        ended = replace(SESSION, last_seen=1.0)
        for snapshot in (probed_later, ours_there):
            result = llama(leases=lease, snapshot=snapshot, session=ended, learned=NO_RAM)
            assert (result.slot, result.queue_s) != (0, 0.0)
            assert result.slot != 0 or "waits ~" in result.note

    def test_unproven_implicit_session_pays_for_the_slot_it_takes(self) -> None:
        """Not proven to continue, it looks no turn ahead, and every slot is held: it takes the
        least recently used one at that session's eviction cost, pinned there (left to
        llama-server it would land there all the same, at the same cost; issue #41: it used to be
        kept off every held slot, however long its holder had been away)."""
        leases = (SlotLease(0, "a", 9.0, 9000), SlotLease(1, "b", 9.5, 9000))
        result = llama(NOTHING, leases, session=SessionView("s"), source=SessionSource.IMPLICIT)
        assert (result.slot, result.evicts, result.horizon) == (0, "a", 0.0)
        assert result.evict_cost_s > 0
        assert "takes slot 0 from session" in result.note

    def test_taking_a_slot_busy_with_its_holders_turn_costs_the_holder_the_wait(self) -> None:
        """A slot running its holder's own turn: the holder is active, its next turn comes soon and
        finds this request there. Taking it costs that wait (this prompt's prefill and half a typical
        request) on top of the cache the holder loses; an idle holder's slot costs only the cache
        (issue #45: a one-off took an agent's slot as its turn ended, and the agent's next turn
        waited 5-9 s)."""
        leases = (SlotLease(0, "a", 9.0, 9000), SlotLease(1, "b", 9.5, 9000))
        source = SessionSource.IMPLICIT
        idle = llama(NOTHING, leases, session=SessionView("s"), source=source, learned=NO_RAM)
        busy = replace(
            llama_snapshot((True, True)),
            slots=(SlotState(0, 32768, True, 1.0), SlotState(1, 32768, True, 2.0)),
        )
        active = llama(
            NOTHING, leases, session=SessionView("s"), source=source, snapshot=busy, learned=NO_RAM
        )
        stats = NO_RAM.for_deployment(LLAMA, EngineKind.LLAMACPP)
        wait = prefill_s(LLAMA, stats, 10_000 - active.expected_cached_tokens) + stats.service_s.value / 2
        assert active.evict_cost_s == pytest.approx(idle.evict_cost_s + wait, rel=0.05)
        assert "takes slot" in active.note

    def test_a_one_off_left_to_llama_server_pays_for_the_slot_that_frees_first(self) -> None:
        """Both slots busy with their sessions' turns: a request naming no slot waits for the first
        to free and takes it, evicting that session's conversation (a chat request did this to an
        agent in the mixed benchmark: its next turn re-prefilled 18k tokens). With the lease
        expired there is no one to evict."""
        busy = replace(
            llama_snapshot((True, True)),
            slots=(SlotState(0, 32768, True, 3.0), SlotState(1, 32768, True, 1.0)),
        )
        leases = (SlotLease(0, "a", 9.0, 9000), SlotLease(1, "b", 9.0, 9000))
        result = llama(NOTHING, leases, session=None, snapshot=busy)
        assert (result.slot, result.evicts) == (None, "b")
        assert result.evict_cost_s > 0
        assert "takes slot 1 (llama-server's pick) from session" in result.note
        expired = llama(NOTHING, leases, session=None, snapshot=busy, now=9.0 + 600.0)
        assert (expired.slot, expired.evicts, expired.evict_cost_s) == (None, "b", 0.0)
        assert (
            f"takes slot 1 (llama-server's pick): session {session_label('b')}'s lease expired"
            in expired.note
        )

    def test_a_sessions_turn_always_names_a_slot(self) -> None:
        """Both slots busy with other sessions' turns: a session's turn waits for a named one. Left to
        llama-server it would wait until a slot frees with no task pinned to it, and turnout pins
        every other turn (policies.slots)."""
        busy = replace(
            llama_snapshot((True, True)),
            slots=(SlotState(0, 32768, True, 3.0), SlotState(1, 32768, True, 1.0)),
        )
        leases = (SlotLease(0, "a", 9.0, 9000), SlotLease(1, "b", 9.0, 9000))
        newcomer = SessionView("c", prompt_tokens=0, turns=0)
        stats = LearnedState().for_deployment(LLAMA, EngineKind.LLAMACPP)
        situation = Situation(busy, LLAMA, stats, NOTHING, newcomer, leases, 10.0, 600.0)
        assert [option.slot for option in llama_options(features(), situation)] == [0, 1]
        assert llama(NOTHING, leases, session=newcomer, snapshot=busy).slot == 1
        one_off = replace(situation, session=None)
        assert [option.slot for option in llama_options(features(), one_off)] == [None]

    def test_on_a_crowded_server_a_turn_that_would_wait_names_no_slot(self) -> None:
        """More active sessions at home than slots (``policies.homes``): a turn names a slot only to
        start now; one that would wait takes the first slot to free, in llama-server's arrival
        order, and restores its conversation from the RAM cache (issue #45)."""
        busy = replace(
            llama_snapshot((True, True)),
            slots=(SlotState(0, 32768, True, 3.0), SlotState(1, 32768, True, 1.0)),
        )
        leases = (SlotLease(0, "a", 9.0, 9000), SlotLease(1, "b", 9.0, 9000))
        stats = LearnedState().for_deployment(LLAMA, EngineKind.LLAMACPP)
        in_ram = PrefixMatch(  # the slots hold the others' conversations, the RAM cache this one's
            (SlotMatch(0, 0), SlotMatch(1, 0)), recent=9000, recent_whole=True, recent_held=9000
        )
        crowded = Situation(busy, LLAMA, stats, in_ram, SESSION, leases, 10.0, 600.0, sharing=3)
        options = llama_options(features(), crowded)
        assert [option.slot for option in options] == [None]
        assert (options[0].source, options[0].lands) == ("ram", 1)  # the first to free
        assert "for the first slot to free (no slot named: 3 sessions share its slots)" in options[0].note()
        one_idle = replace(busy, slots=(busy.slots[0], SlotState(1, 32768, False)))
        options = llama_options(features(), replace(crowded, snapshot=one_idle))
        assert [option.slot for option in options] == [1, None]  # the idle one, by name: it starts now
        assert [option.slot for option in llama_options(features(), replace(crowded, sharing=0))] == [0, 1]

    def test_a_busy_slot_waits_for_its_request_not_for_the_other_slots_prompts(self) -> None:
        """llama-server runs the other slots' prompt chunks in the steps that decode the running
        request, and that request's predicted rest (``busy_s``) is the wait; an idle slot waits
        behind those prompts instead (issue #45: adding the backlog to a busy slot's wait too
        over-predicted it by 1.5 s on average on 8 llama-servers)."""
        snapshot = replace(
            llama_snapshot((True, True)),
            slots=(SlotState(0, 32768, True, 1.0), SlotState(1, 32768, True, 5.0)),
            prefill_backlog_s=2.0,
        )
        result = llama(leases=(SlotLease(0, "s", 1.0, 9000),), snapshot=snapshot, learned=NO_RAM)
        assert (result.slot, result.queue_s) == (0, pytest.approx(1.0))
        assert "waits ~1.0 s for slot 0" in result.note
        idle = replace(snapshot, slots=(SlotState(0, 32768, False), snapshot.slots[1]))
        assert llama(leases=(SlotLease(0, "s", 1.0, 9000),), snapshot=idle, learned=NO_RAM).queue_s == 2.0

    def test_deferred_prompts_delay_a_busy_slot_but_not_an_idle_one(self) -> None:
        """Requests deferred for a busy slot are not in the engine: a request sent now to an idle
        slot starts before them (their prompts come after its own), while one waiting for a busy
        slot may start after them. Counting them ahead of an idle slot predicted a session's warm
        slot 4 s slower than it was, and it left for a cold one (contention-16-8llama, issue #45)."""
        snapshot = replace(
            llama_snapshot((False, True)),
            slots=(SlotState(0, 32768, False), SlotState(1, 32768, True, 1.0)),
            prefill_backlog_s=0.5,
            deferred_prefill_s=4.0,
        )
        idle = llama(leases=(SlotLease(0, "s", 1.0, 9000),), snapshot=snapshot, learned=NO_RAM)
        assert (idle.slot, idle.queue_s, idle.deferred_s) == (0, pytest.approx(0.5), 0.0)
        other_busy = replace(snapshot, slots=(SlotState(0, 32768, True, 20.0), snapshot.slots[1]))
        busy = llama(leases=(SlotLease(1, "s", 1.0, 9000),), snapshot=other_busy, learned=NO_RAM)
        assert (busy.slot, busy.queue_s) == (1, pytest.approx(1.0 + 4.0))
        assert busy.deferred_s == 0.0  # turnout's own request holds the slot: the fleet knows when it ends

    def test_a_slot_busy_with_others_work_is_a_predicted_deferral(self) -> None:
        """A probe saw the slot busy with a request turnout did not send: how long the request waits
        there, deferred, is a prediction the fleet keeps (``Sent.deferred_s``)."""
        snapshot = replace(
            llama_snapshot((True, True)),
            slots=(SlotState(0, 32768, True), SlotState(1, 32768, True)),
        )
        result = llama(leases=(SlotLease(0, "s", 1.0, 9000),), snapshot=snapshot, learned=NO_RAM)
        assert result.slot == 0
        assert result.deferred_s == pytest.approx(result.queue_s)
        assert result.deferred_s > 0

    def test_one_off_request_is_pinned_to_a_free_idle_slot(self) -> None:
        """llama-server's own LRU choice could evict a session; a free idle slot is named instead."""
        result = llama(NOTHING, (SlotLease(1, "a", 9.0, 100),), session=None)
        assert (result.slot, result.evicts) == (0, None)

    def test_a_hybrid_slot_sharing_only_a_system_prompt_teaches_nothing(self) -> None:
        """Both slots hold other conversations that share this prompt's 6k-token system prompt: by
        the checkpoint rules a hybrid slot gives nothing there, so the miss that follows must leave
        the learned reuse alone (it used to count as 0 of 6k reused: the next warm turns were
        predicted 0.7x of what they got, and lost to vLLM)."""
        others = PrefixMatch(
            (SlotMatch(0, 6000, held=30_000), SlotMatch(1, 6000, held=28_000)),
            recent=6000,
            recent_held=30_000,
        )
        fresh = llama(others, session=SessionView("s"), source=SessionSource.IMPLICIT)
        assert (fresh.expected_cached_tokens, fresh.source, fresh.shared_prefix_tokens) == (0, "none", 0)
        missed = Outcome(
            "llama", "m", EngineKind.LLAMACPP, Usage(10_000, 8, 0), 3.0, 4.0, 40_000,
            fresh.shared_prefix_tokens, True, predicted=fresh,
        )  # fmt: skip
        learned = learn(LearnedState(), missed, LLAMA)
        assert (
            learned.for_deployment(LLAMA, EngineKind.LLAMACPP).reuse
            == LearnedState().for_deployment(LLAMA, EngineKind.LLAMACPP).reuse
        )
        warm = llama(leases=(SlotLease(0, "s", 1.0, 9000),), learned=learned)
        assert warm.expected_cached_tokens == round((9000 - 1) * 0.97)

    def test_vllm_hybrid_reuses_nothing_until_a_hit_is_seen(self) -> None:
        result = estimate(
            features(), VLLM, vllm_snapshot(), session=SESSION, leases=(), learned=LearnedState(), match=HELD
        )
        assert result.expected_cached_tokens == 0

    def test_vllm_hybrid_with_a_profile_that_measured_its_blocks_reuses_them_from_the_start(self) -> None:
        """A profile whose calibration saw vLLM reuse a hybrid model's prompts in 1,568-token blocks
        (the H100 run: every turn reused whole blocks of it) prices the first turn a fresh gateway sends
        back with those blocks reused; before, the first prefix hit was priced as none (+301% TTFT)."""
        deployment = replace(VLLM, profile=load_profile("h100-vllm-27b-shape"))
        stats = LearnedState().for_deployment(deployment, EngineKind.VLLM)
        assert (stats.block, stats.reuse.value) == (1568, 1.0)
        session = SessionView("s", turns=1, prompt_tokens=2014)
        result = estimate(
            features(2448), deployment, vllm_snapshot(), session=session, leases=(), learned=LearnedState(),
            match=PrefixMatch(recent=2142),
        )  # fmt: skip
        assert result.expected_cached_tokens == 1568  # what the engine reused on the GPU
        assert LearnedState().for_deployment(VLLM, EngineKind.VLLM).block == 0  # no profile: unknown

    def test_vllm_learns_block_aligned_reuse(self) -> None:
        """After a 600-token prompt reused 512 of a 600-token history, a 1000-token history predicts 768."""
        outcome = Outcome("vllm", "m", EngineKind.VLLM, Usage(700, 8, 512), 0.1, 0.3, 2500, 600, True)
        learned = learn(LearnedState(), outcome, VLLM)
        stats = learned.for_deployment(VLLM, EngineKind.VLLM)
        assert stats.block == 512
        session = SessionView("s", turns=2, prompt_tokens=1000)
        match = PrefixMatch(recent=1000)
        result = estimate(
            features(1200), VLLM, vllm_snapshot(), session=session, leases=(), learned=learned, match=match
        )
        assert result.expected_cached_tokens == 512  # whole blocks of 1000 * (512 / 600)

    def test_vllm_reported_block_refines_what_was_learned(self) -> None:
        """The same hit, from an engine that reports its prefix cache in blocks of 32 tokens
        (``vllm:cache_config_info``): one hit of 512 no longer means blocks of 512 (a busy machine's
        real vLLM test predicted 256 of the 352 it reused): 1000 shared tokens predict 992."""
        outcome = Outcome("vllm", "m", EngineKind.VLLM, Usage(700, 8, 512), 0.1, 0.3, 2500, 600, True)
        learned = learn(LearnedState(), outcome, VLLM)
        snapshot = replace(vllm_snapshot(), cache_block=32)
        session = SessionView("s", turns=2, prompt_tokens=1000)
        result = estimate(
            features(1200),
            VLLM,
            snapshot,
            session=session,
            leases=(),
            learned=learned,
            match=PrefixMatch(recent=1000),
        )
        assert result.expected_cached_tokens == 992  # whole blocks of 32 in 999 tokens
        fresh = estimate(
            features(), VLLM, snapshot, session=SESSION, leases=(), learned=LearnedState(), match=HELD
        )
        assert fresh.expected_cached_tokens == 0  # a hybrid model's reuse is learned from a first hit
