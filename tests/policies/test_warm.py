"""Warming a llama.cpp slot in the background (``policies.warm``): a session's turn served where it
is fast, its prompt prefilled meanwhile into a free llama.cpp slot for the next turn; only where
that pays, only for a session proven to continue, and only in profiles that warm."""

from __future__ import annotations

import pytest
from msgspec.structs import replace

from policies import BUILTIN_PROFILES, route
from policies.decision import Decision, ScoredCandidate
from policies.others import OTHERS_SHARE
from policies.route import RoutingContext
from policies.types import BackendSnapshot, PrefixMatch, SessionSource, SessionView, SlotLease, SlotMatch
from policies.views import CandidateView
from policies.warm import offer
from tests.policies.cost_helpers import features, llama_snapshot, vllm_snapshot

NEW = SessionView("s", None, None, turns=0)
"""A session named by its client (``x-session-id``), before its first turn."""
THINKING = SessionView("s", "vllm", None, prompt_tokens=26_000, turns=2, last_seen=4.0)
"""A session on vLLM whose last turn ended 6 s before this one (``decide`` routes at 10.0): its next
turn is expected as long after this one ends."""


def decide(
    session: SessionView | None = NEW,
    *,
    llama: BackendSnapshot | None = None,
    vllm: BackendSnapshot | None = None,
    profile: str = "cost",
    source: SessionSource = SessionSource.HEADER,
    leases: tuple[SlotLease, ...] = (),
    matches: dict[str, PrefixMatch] | None = None,
    prompt: int = 10_000,
) -> Decision:
    context = RoutingContext(session=session, leases={"llama": leases}, matches=matches or {})
    snapshots = [vllm or vllm_snapshot(), llama or llama_snapshot()]
    return route(features(prompt, source), snapshots, BUILTIN_PROFILES[profile], 10.0, context)


def candidate(decision: Decision, backend: str) -> ScoredCandidate:
    return next(c for c in decision.candidates if c.deployment.backend_id == backend)


def test_a_sessions_first_turn_goes_to_vllm_and_warms_a_free_llama_slot() -> None:
    """Cold on llama.cpp now costs seconds; on vLLM with the slot warmed meanwhile the next turn is
    as warm as if this one had run there."""
    decision = decide()
    assert decision.chosen is not None
    assert decision.chosen.backend_id == "vllm"
    warm = decision.warm_up
    assert warm is not None
    assert warm.backend_id == "llama"
    assert warm.slot in (0, 1)
    vllm, llama = candidate(decision, "vllm"), candidate(decision, "llama")
    base = decide(profile="cost", llama=llama_snapshot(queued=1))  # the same turn, nothing to warm
    late = max(0.0, llama.estimate.ttft_s - vllm.estimate.total_s)  # the next turn waits that much
    horizon = vllm.estimate.horizon  # ...and the turns after it find the slot warm
    assert vllm.estimate.future_s == pytest.approx(llama.estimate.future_s + late / horizon)
    assert vllm.estimate.future_s < candidate(base, "vllm").estimate.future_s
    assert vllm.estimate.objective_ttft_s < llama.estimate.objective_ttft_s
    assert warm.ready_s == pytest.approx(llama.estimate.ttft_s)


def test_without_a_warm_up_the_same_turn_goes_cold_to_llama() -> None:
    """What the warm-up changes: the look-ahead alone sends a session's first turn to a cold slot."""
    decision = decide(profile="cost", llama=llama_snapshot(queued=1))  # nothing to warm: a request waits
    assert decision.warm_up is None
    assert candidate(decision, "vllm").estimate.warm_up is None


@pytest.mark.parametrize("profile", ["least-loaded", "llm-d", "sglang-cache-aware", "dynamo-kv"])
def test_profiles_that_do_not_warm_never_do(profile: str) -> None:
    assert decide(profile=profile).warm_up is None


def test_a_first_turn_known_only_by_its_content_is_not_warmed() -> None:
    """It may be a one-off: its warm-up would take a slot and the engine's prefill for nothing."""
    assert decide(source=SessionSource.IMPLICIT).warm_up is None
    second = SessionView("s", "vllm", None, prompt_tokens=8000, turns=1)
    assert decide(second, source=SessionSource.IMPLICIT).warm_up is not None  # proven: it came back


def test_a_one_off_is_not_warmed() -> None:
    assert decide(session=None).warm_up is None


def test_no_slot_is_taken_from_another_session() -> None:
    others = (SlotLease(0, "h:a", 9.0, 5000), SlotLease(1, "h:b", 9.0, 5000))
    decision = decide(leases=others)
    assert decision.warm_up is None


def test_a_session_warm_on_its_own_slot_goes_there() -> None:
    held = PrefixMatch(
        (SlotMatch(0, 9000, whole=True), SlotMatch(1, 0)), recent=9000, recent_whole=True, recent_held=9000
    )
    session = SessionView("s", "llama", 0, prompt_tokens=9000, turns=3)
    decision = decide(session, leases=(SlotLease(0, "s", 9.0, 9000),), matches={"llama": held})
    assert decision.chosen is not None
    assert decision.chosen.backend_id == "llama"
    assert decision.slot == 0
    assert decision.warm_up is None


def test_the_warm_up_prices_what_its_prefill_costs_the_llama_engines_arrivals() -> None:
    """OTHERS_SHARE x rate x prefill x (queue + prefill), as vLLM's prompt processing is priced: the
    warm-up holds the engine's batches while it prefills."""
    quiet = decide()
    busy = decide(llama=replace(llama_snapshot(), arrivals_per_s=0.05))
    llama = candidate(busy, "llama").estimate
    expected = OTHERS_SHARE * 0.05 * llama.prefill_s * (llama.queue_s + llama.prefill_s)
    assert busy.warm_up is not None
    assert busy.warm_up.cost_s == pytest.approx(expected)
    vllm_quiet, vllm_busy = candidate(quiet, "vllm").estimate, candidate(busy, "vllm").estimate
    assert vllm_busy.others_s - vllm_quiet.others_s == pytest.approx(expected)
    busier = decide(llama=replace(llama_snapshot(), arrivals_per_s=2.0))  # costs more than it saves
    assert candidate(busier, "vllm").estimate.warm_up is None


def test_a_warm_up_is_sent_after_the_prompts_clients_wait_for() -> None:
    """llama-server would run the warm-up's chunks in the same batches as a client's prompt in
    progress, slowing it: the warm-up waits for it (``delay_s``), and is ready that much later;
    behind another warm-up it does not wait (no client does)."""
    snapshot = replace(llama_snapshot((True, False)), prefill_backlog_s=0.4, warming_s=0.0)
    decision = decide(THINKING, llama=snapshot, prompt=30_000)
    warm = decision.warm_up
    assert warm is not None
    assert warm.slot == 1
    assert warm.delay_s == pytest.approx(0.4)
    assert warm.ready_s == pytest.approx(0.4 + warm.prefill_s)
    behind = decide(THINKING, llama=replace(snapshot, warming_s=0.4), prompt=30_000).warm_up
    assert behind is not None
    assert behind.delay_s == 0.0


def test_the_time_a_session_takes_between_turns_leaves_a_warm_up_time() -> None:
    """A cold prefill longer than this turn's answer is ready before the next turn of a session
    that takes its time between turns (``think_s``): that turn finds the slot warm. A hasty
    session's next turn waits for it, and only that turn: the ones after find it warm."""
    thinking = decide(THINKING, prompt=30_000)
    assert thinking.warm_up is not None
    vllm, llama = candidate(thinking, "vllm").estimate, candidate(thinking, "llama").estimate
    assert vllm.future_s == pytest.approx(llama.future_s)
    hasty = decide(replace(THINKING, last_seen=9.9), prompt=30_000)  # its next turn 0.1 s after this one
    assert hasty.warm_up is not None
    late = llama.ttft_s - vllm.total_s - 0.1
    assert late > 1.0
    waits = candidate(hasty, "vllm").estimate
    assert waits.future_s == pytest.approx(llama.future_s + late / waits.horizon)


def test_a_warm_up_ready_after_the_next_turn_comes_makes_it_wait() -> None:
    """The next turn comes no sooner than this one ends where it is served (``total_s``): a warm-up
    ready later adds the difference to it, once over the turns ahead (issue #45: added to each of
    them, a warm-up 1.2 s late was not sent, and an agent's next turn 9.6 s later went cold to
    llama.cpp: contention-2-nosession's seed 15, 1.20x the best peer's mean TTFT; 1.12x now)."""
    decision = decide()
    vllm, llama = candidate(decision, "vllm"), candidate(decision, "llama")
    views = {
        c.deployment.backend_id: CandidateView(c.deployment, s, c.estimate)
        for c, s in ((vllm, vllm_snapshot()), (llama, llama_snapshot()))
    }
    base = replace(vllm.estimate, warm_up=None, future_s=10.0, others_s=0.0)
    slow = replace(llama.estimate, ttft_s=base.total_s + 2.0)
    offered = offer(replace(views["vllm"], estimate=base), replace(views["llama"], estimate=slow))
    assert offered is not None
    assert offered.future_s == pytest.approx(llama.estimate.future_s + 2.0 / base.horizon)
    assert offer(replace(views["vllm"], estimate=replace(base, horizon=0.0)), views["llama"]) is None
