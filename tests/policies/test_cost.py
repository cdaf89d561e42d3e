"""The cost model: expected reuse per engine semantics, slot choice, and monotone predictions."""

from __future__ import annotations

import math

import pytest
from hypothesis import given
from hypothesis import strategies as st
from msgspec.structs import replace

from backends.engine_profiles import load_profile
from policies import (
    BUILTIN_PROFILES,
    Architecture,
    BackendSnapshot,
    Deployment,
    Endpoint,
    EngineKind,
    Health,
    RequestFeatures,
    route,
)
from policies.cost import estimate
from policies.learning import PRIMED_SAMPLES, SPREAD, Ewma, LearnedState, learn
from policies.pricing import BATCH_SLOWDOWN, STEP_TOKENS
from policies.route import RoutingContext
from policies.sessions import session_label
from policies.slots import Situation, keep_chance, llama_options
from policies.types import (
    Decision,
    Estimate,
    Outcome,
    PrefixMatch,
    SessionSource,
    SessionView,
    SlotLease,
    SlotMatch,
    SlotState,
    Usage,
)

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


SESSION = SessionView("s", "llama", 0, prompt_tokens=9000, turns=3)
HELD = PrefixMatch(
    (SlotMatch(0, 9000, whole=True), SlotMatch(1, 0)), recent=9000, recent_whole=True, recent_held=9000
)
NOTHING = PrefixMatch((SlotMatch(0, 0), SlotMatch(1, 0)), recent=0)
NO_RAM = learn(
    LearnedState(),
    Outcome(
        "llama",
        "m",
        EngineKind.LLAMACPP,
        Usage(9000, 8, 0),
        1.0,
        2.0,
        30_000,
        9000,
        True,
        predicted=Estimate(0, 0.0, 0.0, 0.0, source="ram", ram_tokens=8500, ram_span=9000),
    ),  # a restore of 8500 tokens expected, none came: the server keeps nothing (--cache-ram 0)
    LLAMA,
)


def llama(
    match: PrefixMatch = HELD,
    leases: tuple[SlotLease, ...] = (),
    *,
    session: SessionView | None = SESSION,
    learned: LearnedState | None = None,
    snapshot: BackendSnapshot | None = None,
    source: SessionSource = SessionSource.HEADER,
    now: float = 10.0,
) -> Estimate:
    return estimate(
        features(source=source),
        LLAMA,
        snapshot or llama_snapshot(),
        session=session,
        leases=leases,
        learned=learned or LearnedState(),
        match=match,
        now=now,
        lease_idle_s=600.0,
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

    def test_a_busy_slot_also_waits_for_the_prompts_of_the_other_slots(self) -> None:
        """llama-server runs every slot's prompt chunks in the batches that decode the others: a
        busy slot's request stalls while another slot prefills, so the wait for it is its predicted
        rest plus the prefill backlog (left out, the waits that taught llama.cpp's queue factor
        2.8 on the chat benchmark)."""
        snapshot = replace(
            llama_snapshot((True, True)),
            slots=(SlotState(0, 32768, True, 1.0), SlotState(1, 32768, True, 5.0)),
            prefill_backlog_s=2.0,
        )
        result = llama(leases=(SlotLease(0, "s", 1.0, 9000),), snapshot=snapshot, learned=NO_RAM)
        assert (result.slot, result.queue_s) == (0, pytest.approx(3.0))
        assert "waits ~3.0 s for slot 0" in result.note

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
    """Predicted 1 s of queue (of 1.5 s TTFT) on vLLM and waited 3 s: later queues count three
    times there. A llama.cpp slot's queue is modelled whole and teaches nothing (its waits spread
    with the unknown answers ahead; a factor learned there scaled every later wait up)."""
    predicted = Estimate(0, queue_s=1.0, ttft_s=1.5, total_s=2.0, modelled_queue_s=1.0, primed=True)
    outcome = Outcome(
        "vllm", "m", EngineKind.VLLM, Usage(1000, 8, 0), 3.5, 4.0, 0, 0, True, predicted=predicted
    )
    learned = learn(LearnedState(), outcome, VLLM)
    assert learned.for_deployment(VLLM, EngineKind.VLLM).queue_factor.value == pytest.approx(3.0)
    queued = estimate(
        features(), VLLM, vllm_snapshot(running=4, queued=2), session=None, leases=(), learned=learned
    )
    assert queued.queue_s == pytest.approx(3.0 * queued.modelled_queue_s)
    on_llama = replace(outcome, backend_id="llama", kind=EngineKind.LLAMACPP)
    stats = learn(LearnedState(), on_llama, LLAMA).for_deployment(LLAMA, EngineKind.LLAMACPP)
    assert stats.queue_factor.samples == 0


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


def test_learning_ignores_nonsense() -> None:
    outcome = Outcome(
        "llama", "m", EngineKind.LLAMACPP, Usage(1000, 21, 0, 1e-9, 200.0), 0.06, 0.3, 0, 0, True
    )
    stats = learn(LearnedState(), outcome, LLAMA).for_deployment(LLAMA, EngineKind.LLAMACPP)
    assert stats.prefill_tok_s.value <= 3000 * SPREAD  # clamped to the prior's spread


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
        0.95,
        0.33,
    )
    assert round(on_llama.objective_ttft_s, 2) == 4.25  # with the margin: a decode step, 9 ms
    assert round(on_vllm.objective_ttft_s, 2) == 13.05  # 16 ms
    assert "takes slot 0 from session" in on_llama.note
    situation = Situation(llama, LLAMA, LearnedState().for_deployment(LLAMA, EngineKind.LLAMACPP), match,
                          session, leases, now, 600.0)  # fmt: skip
    b = next(option for option in llama_options(request, situation) if option.slot == 1)
    assert (b.source, b.evicts, round(b.evict_cost_s, 2)) == ("none", "h:b", 0.09)  # B restores from RAM


BOTH_HELD = {"llama": (SlotLease(0, "a", 9.0, 9000), SlotLease(1, "b", 9.0, 9000))}


def idle_llama(now: float) -> BackendSnapshot:
    """llama.cpp probed at ``now``: two idle slots of 64k."""
    slots = (SlotState(0, 65536, False), SlotState(1, 65536, False))
    return BackendSnapshot(
        "llama", EngineKind.LLAMACPP, Health.READY, now, (LLAMA,), slots=slots, total_slots=2
    )


class TestKeepChance:
    """A new pin is worth its look-ahead only as far as it is likely to last (``keep_chance``)."""

    def test_a_holder_keeps_its_slot(self) -> None:
        assert keep_chance(SessionView("a"), BOTH_HELD, slots=2, live_sessions=8) == 1.0

    def test_sessions_that_fit_in_the_slots_keep_them(self) -> None:
        assert keep_chance(SessionView("new"), BOTH_HELD, slots=2, live_sessions=2) == 1.0

    def test_a_newcomer_among_eight_live_sessions_gets_its_share(self) -> None:
        assert keep_chance(SessionView("new"), BOTH_HELD, slots=2, live_sessions=8) == 0.25

    def test_no_session_or_no_slots(self) -> None:
        assert keep_chance(None, BOTH_HELD, slots=2, live_sessions=8) == 1.0
        assert keep_chance(SessionView("new"), {}, slots=0, live_sessions=8) == 1.0

    @staticmethod
    def first_turn(live_sessions: int) -> str | None:
        """A named session's first turn (16k tokens); slot 0 idle and free, slot 1 held; vLLM idle."""
        now = 100.0
        llama = idle_llama(now)
        request = RequestFeatures("m", Endpoint.CHAT, 16_000, 256, True, "new", SessionSource.HEADER)
        context = RoutingContext(
            session=SessionView("new"),
            leases={"llama": (SlotLease(1, "b", now - 5, 20_000),)},
            matches={"llama": NOTHING},
            live_sessions=live_sessions,
        )
        decision = route(request, [llama, vllm_snapshot()], BUILTIN_PROFILES["cost"], now, context)
        assert decision.chosen is not None
        return decision.chosen.backend_id

    def test_a_free_slot_is_taken_while_sessions_fit_and_left_when_they_do_not(self) -> None:
        """Two live sessions on two slots: the newcomer pins the free slot for its next turns. Eight:
        the pin likely goes to another session before it pays off; vLLM's faster first turn wins."""
        assert self.first_turn(live_sessions=2) == "llama"
        assert self.first_turn(live_sessions=8) == "vllm"


class TestFirstTurnFollowUp:
    """A first turn known only by its content looks ahead by the learned follow-up rate, and only
    while a llama.cpp slot is free: an agent's first turn may start where its conversation will be
    cheap; one-off traffic, or slots all held, keep it on the faster first turn."""

    @staticmethod
    def first_turn(follow_rate: float, held: tuple[SlotLease, ...] = ()) -> Decision:
        now = 100.0
        llama = idle_llama(now)
        request = RequestFeatures("m", Endpoint.CHAT, 8_000, 256, True, "i:1", SessionSource.IMPLICIT)
        context = RoutingContext(
            session=SessionView("i:1"),
            leases={"llama": held},
            matches={"llama": NOTHING},
            live_sessions=2,
            follow_rate=follow_rate,
        )
        return route(request, [llama, vllm_snapshot()], BUILTIN_PROFILES["cost"], now, context)

    @staticmethod
    def chosen(decision: Decision) -> tuple[str | None, float]:
        best = decision.chosen_candidate
        assert best is not None
        assert best.estimate is not None
        return best.deployment.backend_id, best.estimate.horizon

    def test_conversations_that_come_back_start_on_a_free_slot(self) -> None:
        assert self.chosen(self.first_turn(follow_rate=0.8)) == ("llama", pytest.approx(2.4))

    def test_one_off_traffic_starts_on_the_faster_first_turn(self) -> None:
        assert self.chosen(self.first_turn(follow_rate=0.02)) == ("vllm", pytest.approx(0.06))

    def test_no_look_ahead_when_every_slot_is_held(self) -> None:
        held = (SlotLease(0, "a", 99.0, 9000), SlotLease(1, "b", 99.0, 9000))
        assert self.chosen(self.first_turn(follow_rate=0.8, held=held)) == ("vllm", 0.0)


def test_a_busy_batch_slows_decoding_not_the_prompt() -> None:
    """An engine step prefills a chunk of the prompt and decodes every running request once: the
    requests running there make the answer slower, not the prompt's own processing (the engines'
    step rule; a prefill priced 6% slower per running request sent chat bursts from an idle vLLM to
    a busy llama.cpp). The first token waits for the decode steps run with the prompt's chunks."""
    learned = LearnedState()
    idle = estimate(features(), VLLM, vllm_snapshot(), session=None, leases=(), learned=learned)
    busy = estimate(features(), VLLM, vllm_snapshot(running=20), session=None, leases=(), learned=learned)
    assert busy.prefill_s == idle.prefill_s == pytest.approx(10_000 / 6600)
    assert busy.total_s - busy.ttft_s > idle.total_s - idle.ttft_s  # the answer is slower


def test_vllm_prices_the_decode_steps_run_with_its_prompt_and_the_backlog() -> None:
    """Each vLLM step that takes a chunk of the backlog ahead or of this prompt also decodes the 20
    requests running there: ceil((backlog + prompt) / step tokens) steps of that batch, at the
    profile's step (or the prior rate), not the learned decode rate (measured on answers whose
    steps already carried prompt chunks). Left out, vLLM was predicted 0.4-0.7 s short under chat
    load (bench/predictions.py)."""
    learned = LearnedState()
    snapshot = replace(vllm_snapshot(running=20), prefill_backlog_s=0.5)
    busy = estimate(features(), VLLM, snapshot, session=None, leases=(), learned=learned)
    steps = math.ceil((0.5 * 6600 + 10_000) / STEP_TOKENS)
    assert busy.interleaved_s == pytest.approx(steps * (1 + BATCH_SLOWDOWN * 19) / 64.0)
    # the first token comes with the prompt's last chunk: no decode step of its own
    assert busy.ttft_s == pytest.approx(busy.queue_s + busy.prefill_s + busy.interleaved_s)
    idle = estimate(features(), VLLM, vllm_snapshot(), session=None, leases=(), learned=learned)
    assert idle.interleaved_s == 0.0
    profiled = replace(VLLM, profile=load_profile("seed-5090-vllm-27b"))
    priced = estimate(features(), profiled, snapshot, session=None, leases=(), learned=learned)
    profile = profiled.profile
    assert profile is not None
    rate = learned.for_deployment(profiled, EngineKind.VLLM).prefill_tok_s.value
    steps = math.ceil((0.5 * rate + 10_000) / profile.prefill.batch)
    assert priced.interleaved_s == pytest.approx(steps * profile.decode_step_seconds(20))
    on_llama = llama(snapshot=replace(llama_snapshot((True, False)), prefill_backlog_s=0.5))
    assert on_llama.interleaved_s == 0.0


CPU_MOE = load_profile("workstation-llamacpp-flash-next-cpu-moe")
MOE = replace(LLAMA, profile=CPU_MOE)


def test_a_profile_prices_the_prefill_by_its_batches() -> None:
    """A 500-token turn on a warm slot pays the profile's expert copy (one big micro-batch), not
    500 tokens at the cold rate; a cold 4k prompt pays one a micro-batch."""
    warm = estimate(
        features(9500), MOE, llama_snapshot(), session=SESSION, leases=(), learned=LearnedState(), match=HELD
    )
    assert warm.expected_cached_tokens > 8000
    new = 9500 - warm.expected_cached_tokens
    assert warm.prefill_s == pytest.approx(CPU_MOE.prefill_seconds(new, warm.expected_cached_tokens))
    cold = estimate(
        features(4096), MOE, llama_snapshot(), session=None, leases=(), learned=LearnedState(), match=NOTHING
    )
    assert cold.prefill_s == pytest.approx(CPU_MOE.prefill_seconds(4096))
    micro_batches = 4096 // CPU_MOE.prefill.ubatch
    assert cold.prefill_s == pytest.approx(
        micro_batches * CPU_MOE.prefill.batch_s + 4096 * CPU_MOE.prefill.token_s
    )


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
