"""The cost model's predicted times: monotone in the queue and the uncached tokens, a busy batch
slowing the answer and the decode steps run with the prompt, a profile's prefill batches; and the
look-ahead a new slot pin is worth (``keep_chance``, a first turn's learned follow-up rate)."""

from __future__ import annotations

import math

import pytest
from hypothesis import given
from hypothesis import strategies as st
from msgspec.structs import replace

from backends.engine_profiles import load_profile
from policies import (
    BUILTIN_PROFILES,
    BackendSnapshot,
    Endpoint,
    EngineKind,
    Health,
    RequestFeatures,
    route,
)
from policies.cost import estimate
from policies.decision import Decision, Estimate, Outcome
from policies.engine_profile import DecodeModel
from policies.learning import LearnedState, learn
from policies.others import OTHERS_SHARE
from policies.pricing import BATCH_SLOWDOWN, STEP_TOKENS
from policies.route import RoutingContext
from policies.slots import keep_chance
from policies.types import PrefixMatch, SessionSource, SessionView, SlotLease, SlotMatch, SlotState, Usage
from tests.policies.cost_helpers import (
    CPU_MOE,
    HELD,
    LLAMA,
    MOE,
    NOTHING,
    SESSION,
    VLLM,
    features,
    llama,
    llama_snapshot,
    vllm_snapshot,
)


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


def test_the_answer_is_priced_at_the_context_learning_scaled_it_from() -> None:
    """Learning scales an observed decode rate back to no context by the profile's context term; the
    prediction must apply the same term, or every answer on a long conversation is priced early (on
    the GPU, a 17k-token turn's 128 tokens were predicted at 10 ms a step where each took 21.6: the
    learned rate had been scaled up and was applied at no context). An answer that took exactly what
    the profile says, learned, prices the same answer again at the same step."""
    profile = replace(
        load_profile("h100-vllm-27b-shape"),
        decode=DecodeModel(step_s=0.02, seq_s=0.001, context_s=0.002),
    )
    deployment = replace(VLLM, profile=profile)
    prompt, answer = 20_000, 129
    step = 0.02 + 20 * 0.002  # 60 ms at 20k tokens of context
    outcome = Outcome(
        "vllm", "m", EngineKind.VLLM, Usage(prompt, answer, 0), ttft_s=1.0,
        duration_s=1.0 + (answer - 1) * step, prompt_chars=prompt * 4, shared_prefix_tokens=0, stream=True,
    )  # fmt: skip
    learned = learn(LearnedState(), outcome, deployment)
    again = estimate(
        replace(features(prompt), max_tokens=answer), deployment, vllm_snapshot(), session=None,
        leases=(), learned=learned,
    )  # fmt: skip
    assert (again.total_s - again.ttft_s) / (answer - 1) == pytest.approx(step, rel=0.02)


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
    def first_turn(live_sessions: int, warms: bool = True) -> str | None:
        """A named session's first turn (16k tokens); slot 0 idle and free, slot 1 held; vLLM idle:
        where it and its next turns go (``vllm+warm``: served on vLLM, slot 0 warmed meanwhile)."""
        now = 100.0
        llama = idle_llama(now)
        request = RequestFeatures("m", Endpoint.CHAT, 16_000, 256, True, "new", SessionSource.HEADER)
        context = RoutingContext(
            session=SessionView("new"),
            leases={"llama": (SlotLease(1, "b", now - 5, 20_000),)},
            matches={"llama": NOTHING},
            live_sessions=live_sessions,
        )
        profile = replace(BUILTIN_PROFILES["cost"], warms=warms)
        decision = route(request, [llama, vllm_snapshot()], profile, now, context)
        assert decision.chosen is not None
        warm = decision.warm_up
        return decision.chosen.backend_id + (f"+warm {warm.slot}" if warm is not None else "")

    def test_a_free_slot_is_taken_while_sessions_fit_and_left_when_they_do_not(self) -> None:
        """Two live sessions on two slots: the newcomer pins the free slot for its next turns (cold
        now, without warm-ups). Eight: the pin likely goes to another session before it pays off;
        vLLM's faster first turn wins."""
        assert self.first_turn(live_sessions=2, warms=False) == "llama"
        assert self.first_turn(live_sessions=8, warms=False) == "vllm"

    def test_with_warm_ups_the_free_slot_is_warmed_while_vllm_serves(self) -> None:
        assert self.first_turn(live_sessions=2) == "vllm+warm 0"


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

    def test_the_decision_says_which_chance_it_weighed(self) -> None:
        assert self.first_turn(follow_rate=0.8).follow_rate == 0.8  # the dashboard shows it
        now = 100.0
        named = RequestFeatures("m", Endpoint.CHAT, 8_000, 256, True, "h:1", SessionSource.HEADER)
        context = RoutingContext(session=SessionView("h:1"), follow_rate=0.8)
        decision = route(named, [idle_llama(now), vllm_snapshot()], BUILTIN_PROFILES["cost"], now, context)
        assert decision.follow_rate is None  # a named session is expected to continue: no bet


class TestWhatItCostsTheNextRequests:
    """``others_s``: a request holds what later ones need (vLLM's prompt processing, a llama.cpp
    slot) and the objective counts it, in proportion to how many requests begin there lately
    (issue #45: an agent's 30k-token turn re-prefilled on vLLM held every one-shot behind it)."""

    def vllm(self, prompt: int, arrivals: float) -> Estimate:
        snapshot = replace(vllm_snapshot(running=1), arrivals_per_s=arrivals)
        return estimate(features(prompt), VLLM, snapshot, session=None, leases=(), learned=LearnedState())

    def test_a_prompt_on_vllm_costs_each_request_arriving_before_it_is_processed(self) -> None:
        quiet, busy = self.vllm(30_000, 0.0), self.vllm(30_000, 0.5)
        assert quiet.others_s == 0.0
        expected = OTHERS_SHARE * 0.5 * busy.prefill_s * (busy.queue_s + busy.prefill_s)
        assert busy.others_s == pytest.approx(expected)
        assert busy.objective_ttft_s == pytest.approx(quiet.objective_ttft_s + busy.others_s)
        assert self.vllm(3_000, 0.5).others_s < busy.others_s / 50  # the prefill twice over: ~quadratic

    def test_a_one_off_on_a_llama_slot_costs_those_arriving_for_the_slot_while_it_runs(self) -> None:
        snapshot = replace(llama_snapshot(), arrivals_per_s=0.4)
        one_off = llama(NOTHING, session=None, snapshot=snapshot)
        run = one_off.total_s - one_off.queue_s
        assert one_off.others_s == pytest.approx(OTHERS_SHARE * 0.4 / 2 * run * (one_off.queue_s + run))
        assert one_off.others_s > 0

    def test_replicas_share_the_arrivals_to_come(self) -> None:
        """Interchangeable engines are priced at their kind's mean arrival rate: the requests to come
        are the router's to place. Priced by each replica's own recent count, a long prompt went
        behind a 3 s queue for a replica that had seen fewer requests, where a 1 s queue was free."""

        def replica(name: str, backlog_s: float, arrivals: float) -> BackendSnapshot:
            deployment = replace(VLLM, backend_id=name)
            return replace(
                vllm_snapshot(running=2), backend_id=name, deployments=(deployment,),
                prefill_backlog_s=backlog_s, arrivals_per_s=arrivals,
            )  # fmt: skip

        quiet_but_queued, busy_but_free = replica("a", 3.0, 0.02), replica("b", 1.0, 0.6)
        request = replace(features(30_000), session_key=None)
        decision = route(request, [quiet_but_queued, busy_but_free], BUILTIN_PROFILES["cost"], 0.0)
        assert decision.chosen is not None
        assert decision.chosen.backend_id == "b"
        a, b = (c.estimate for c in decision.candidates)
        assert a is not None
        assert b is not None
        rate = (0.02 + 0.6) / 2
        assert a.others_s == pytest.approx(OTHERS_SHARE * rate * a.prefill_s * (a.queue_s + a.prefill_s))
        assert b.others_s == pytest.approx(OTHERS_SHARE * rate * b.prefill_s * (b.queue_s + b.prefill_s))
        own = estimate(request, quiet_but_queued.deployments[0], quiet_but_queued, session=None,
                       leases=(), learned=LearnedState())  # fmt: skip
        assert own.others_s < a.others_s  # its own count alone made the queued replica look cheap

    def test_a_token_count_costs_no_one(self) -> None:
        snapshot = replace(vllm_snapshot(running=1), arrivals_per_s=0.5)
        count = replace(features(30_000), endpoint=Endpoint.COUNT_TOKENS)
        counted = estimate(count, VLLM, snapshot, session=None, leases=(), learned=LearnedState())
        assert counted.others_s == 0.0

    def test_a_sessions_turn_on_a_llama_slot_costs_no_one(self) -> None:
        """The slot is the session's: the requests that come next would not have taken it."""
        snapshot = replace(llama_snapshot(), arrivals_per_s=0.4)
        assert llama(session=SESSION, snapshot=snapshot).others_s == 0.0

    def test_a_session_leaving_another_llama_server_costs_its_prefill_there(self) -> None:
        """Its conversation is held on the llama-server it leaves: re-prefilled here, it takes the
        steps every slot of this engine shares, as a prompt on vLLM does (issue #45: with two agents
        a slot on 8 llama-servers, sessions left for shorter queues and the fleet prefilled 40% more
        than dynamo-kv's). A session coming from vLLM, or new, has no llama.cpp state to leave."""
        snapshot = replace(llama_snapshot(), arrivals_per_s=0.4)
        moved = llama(NOTHING, session=replace(SESSION, backend_id="llama-b"), snapshot=snapshot)
        expected = OTHERS_SHARE * 0.4 * moved.prefill_s * (moved.queue_s + moved.prefill_s)
        assert moved.others_s == pytest.approx(expected)
        assert moved.others_s > 1.0
        from_vllm = replace(SESSION, backend_id="vllm", slot=None)
        assert llama(NOTHING, session=from_vllm, snapshot=snapshot).others_s == 0.0
        assert llama(NOTHING, session=SESSION, snapshot=snapshot).others_s == 0.0


class TestTheNextTurnsQueue:
    """``future_s`` is the next turn behind the part of this turn's queue that lasts: all of it,
    except on llama.cpp a wait for the session's own slot, a RAM restore and the warm-ups' prefill
    in the engine (``_Objective.lasting``)."""

    def test_vllm_meets_its_queue_again(self) -> None:
        snapshot = replace(vllm_snapshot(running=1), prefill_backlog_s=2.0)
        busy = estimate(features(), VLLM, snapshot, session=SESSION, leases=(), learned=LearnedState())
        idle = estimate(
            features(), VLLM, vllm_snapshot(1), session=SESSION, leases=(), learned=LearnedState()
        )
        assert busy.future_s == pytest.approx(idle.future_s + busy.queue_s - idle.queue_s)

    def test_an_idle_llama_slot_behind_prompts_meets_them_again_but_not_warm_ups(self) -> None:
        fresh = replace(SESSION, backend_id=None, slot=None)
        backlog = replace(llama_snapshot(), prefill_backlog_s=2.0)
        behind = llama(NOTHING, (), session=fresh, snapshot=backlog)
        clear = llama(NOTHING, (), session=fresh)
        assert behind.queue_s == pytest.approx(2.0)
        assert behind.future_s == pytest.approx(clear.future_s + 2.0)
        warming = llama(NOTHING, (), session=fresh, snapshot=replace(backlog, warming_s=1.5))
        assert warming.queue_s == pytest.approx(2.0)
        assert warming.future_s == pytest.approx(clear.future_s + 0.5)  # a warm-up runs once

    def test_the_sessions_own_slot_busy_with_its_warm_up_is_waited_for_once(self) -> None:
        snapshot = replace(
            llama_snapshot((True, False)), slots=(SlotState(0, 32768, True, 1.5), SlotState(1, 32768, False))
        )
        waits = llama(HELD, (SlotLease(0, "s", 1.0, 9000),), snapshot=snapshot)
        idle = llama(HELD, (SlotLease(0, "s", 1.0, 9000),))
        assert (waits.slot, waits.queue_s) == (0, pytest.approx(1.5))
        assert waits.future_s == pytest.approx(idle.future_s)

    def test_a_ram_restore_is_this_turns_only(self) -> None:
        match = PrefixMatch(
            (SlotMatch(0, 0), SlotMatch(1, 0)), recent=9000, recent_whole=True, recent_held=9000
        )
        leases = (SlotLease(0, "other", 1.0, 500), SlotLease(1, "third", 2.0, 500))
        restored = llama(match, leases)
        assert restored.source == "ram"
        assert restored.queue_s > 0
        cold = llama(NOTHING, ())  # the same session's turn on a free slot: no queue, nothing cached
        assert (cold.queue_s, cold.expected_cached_tokens) == (0.0, 0)
        assert restored.future_s == pytest.approx(cold.future_s)  # both leave the prompt in the slot

    def test_a_slot_busy_with_another_sessions_work_is_waited_for_again(self) -> None:
        snapshot = replace(
            llama_snapshot((True, True)), slots=(SlotState(0, 32768, True), SlotState(1, 32768, True))
        )
        waits = llama(NOTHING, (), session=replace(SESSION, backend_id=None, slot=None), snapshot=snapshot)
        free = llama(NOTHING, (), session=replace(SESSION, backend_id=None, slot=None))
        assert waits.queue_s > 0
        assert waits.future_s == pytest.approx(free.future_s + waits.queue_s)
