"""The route engine: filters drop with reasons, scorers rank, ties keep configured order."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st
from msgspec.structs import replace

from policies import (
    BUILTIN_PROFILES,
    Architecture,
    BackendSnapshot,
    Decision,
    Deployment,
    Endpoint,
    EngineKind,
    Health,
    Reason,
    RequestFeatures,
    route,
)
from policies.route import RoutingContext
from policies.types import SessionView

PROFILE = BUILTIN_PROFILES["least-loaded"]


def snapshot(
    backend_id: str,
    *,
    model: str = "m",
    window: int | None = 32_000,
    health: Health = Health.READY,
    running: int = 0,
    queued: int = 0,
    slots: int | None = None,
    kind: EngineKind = EngineKind.VLLM,
) -> BackendSnapshot:
    deployment = Deployment(model, backend_id, f"{model}-upstream", window, Architecture.HYBRID)
    return BackendSnapshot(
        backend_id, kind, health, 0.0, (deployment,), running=running, queued=queued, total_slots=slots
    )


def features(prompt: int = 1000, max_tokens: int | None = 100, model: str = "m") -> RequestFeatures:
    return RequestFeatures(model, Endpoint.CHAT, prompt, max_tokens, stream=False)


class TestFilters:
    @pytest.mark.parametrize(
        ("health", "eligible"),
        [(Health.READY, True), (Health.UNKNOWN, True), (Health.LOADING, False), (Health.DOWN, False)],
    )
    def test_health(self, health: Health, eligible: bool) -> None:
        """Only ready (or not yet probed) backends are candidates."""
        decision = route(features(), [snapshot("a", health=health)], PROFILE, 0.0)
        assert (decision.chosen is not None) == eligible
        if not eligible:
            assert decision.reason is Reason.NO_CANDIDATE
            assert decision.rejected[0].reason is Reason.UNHEALTHY

    @pytest.mark.parametrize(
        ("prompt", "max_tokens", "fits"),
        [(31_000, 1000, True), (31_000, 50_000, True), (31_999, None, True), (32_000, None, False)],
    )
    def test_context_fits(self, prompt: int, max_tokens: int | None, fits: bool) -> None:
        """The prompt must leave room for one token; max_tokens alone refuses nothing (engines clamp)."""
        decision = route(features(prompt, max_tokens), [snapshot("a", window=32_000)], PROFILE, 0.0)
        assert (decision.chosen is not None) == fits
        if not fits:
            assert decision.rejected[0].reason is Reason.CONTEXT_TOO_LONG
            assert "32000" in decision.rejected[0].detail

    def test_prefers_a_backend_with_room_for_the_whole_output(self) -> None:
        snapshots = [snapshot("tight", window=32_000), snapshot("roomy", window=64_000, running=9)]
        decision = route(features(30_000, 8_000), snapshots, PROFILE, 0.0)
        assert decision.chosen is not None
        assert decision.chosen.backend_id == "roomy"
        assert decision.rejected[0].reason is Reason.OUTPUT_WOULD_BE_CUT

    def test_long_prompt_goes_to_the_backend_whose_window_fits(self) -> None:
        snapshots = [snapshot("small", window=8_000), snapshot("large", window=64_000, running=5)]
        decision = route(features(20_000), snapshots, PROFILE, 0.0)
        assert decision.chosen is not None
        assert decision.chosen.backend_id == "large"
        assert [r.backend_id for r in decision.rejected] == ["small"]

    def test_model_served_nowhere(self) -> None:
        decision = route(features(model="other"), [snapshot("a")], PROFILE, 0.0)
        assert decision.chosen is None
        assert decision.reason is Reason.NOT_SERVED


class TestLeastLoaded:
    def test_prefers_idle_backend(self) -> None:
        snapshots = [snapshot("busy", running=3, queued=2), snapshot("idle")]
        decision = route(features(), snapshots, PROFILE, 0.0)
        assert decision.chosen is not None
        assert decision.chosen.backend_id == "idle"
        assert decision.reason is Reason.LEAST_LOADED

    def test_slots_spread_load(self) -> None:
        """Two busy requests on four slots weigh less than one on an engine without slots."""
        snapshots = [
            snapshot("vllm", running=1),
            snapshot("llama", running=2, slots=4, kind=EngineKind.LLAMACPP),
        ]
        decision = route(features(), snapshots, PROFILE, 0.0)
        assert decision.chosen is not None
        assert decision.chosen.backend_id == "llama"

    def test_tie_keeps_configured_order(self) -> None:
        decision = route(features(), [snapshot("first"), snapshot("second")], PROFILE, 0.0)
        assert decision.chosen is not None
        assert decision.chosen.backend_id == "first"

    def test_single_candidate_reason(self) -> None:
        decision = route(features(), [snapshot("only")], PROFILE, 0.0)
        assert decision.reason is Reason.ONLY_CANDIDATE


def group(prefer_default: float = 0.25, min_params_b: float | None = None) -> RequestFeatures:
    """A request for group ``g`` over ``small`` (the default member, on ``a``) and ``large`` (on ``b``)."""
    return replace(
        features(model="g"),
        members=("small", "large"),
        prefer_default=prefer_default,
        min_params_b=min_params_b,
    )


def members(a_running: int, b_running: int, *, b_health: Health = Health.READY) -> list[BackendSnapshot]:
    return [
        snapshot("a", model="small", running=a_running),
        snapshot("b", model="large", running=b_running, health=b_health),
    ]


def model_of(decision: Decision) -> str | None:
    return decision.chosen.model if decision.chosen is not None else None


class TestGroups:
    """A group's member: the default unless another is clearly better; an admin's pin (issue #28)."""

    def test_the_default_member_answers_unless_another_is_clearly_better(self) -> None:
        close = route(group(), members(a_running=5, b_running=4), PROFILE, 0.0)  # 1/6 vs 1/5: 1.2x
        assert model_of(close) == "small"
        assert close.reason is Reason.DEFAULT_MEMBER
        assert close.candidates[1].score > close.candidates[0].score  # the log shows the other was ahead
        clear = route(group(), members(a_running=5, b_running=0), PROFILE, 0.0)  # 6x
        assert model_of(clear) == "large"
        assert clear.reason is Reason.LEAST_LOADED

    def test_without_a_preference_the_cost_model_alone_chooses(self) -> None:
        decision = route(group(prefer_default=0.0), members(a_running=5, b_running=4), PROFILE, 0.0)
        assert model_of(decision) == "large"

    def test_a_default_member_that_cannot_answer_is_no_fallback(self) -> None:
        down = [snapshot("a", model="small", health=Health.DOWN), snapshot("b", model="large", running=9)]
        decision = route(group(), down, PROFILE, 0.0)
        assert model_of(decision) == "large"

    def test_a_pin_sends_every_request_to_one_member(self) -> None:
        pinned = RoutingContext(pins={"g": "large"})
        decision = route(group(), members(a_running=0, b_running=9), PROFILE, 0.0, pinned)
        assert model_of(decision) == "large"
        assert [(r.backend_id, r.reason) for r in decision.rejected] == [("a", Reason.PINNED)]
        assert "g is pinned to large" in decision.rejected[0].detail
        session = SessionView("s", backend_id="a", model="small")  # a conversation on the other member
        moved = route(
            group(), members(0, 9), PROFILE, 0.0, RoutingContext(session=session, pins={"g": "large"})
        )
        assert model_of(moved) == "large"

    def test_a_pinned_member_that_cannot_answer_fails_the_request(self) -> None:
        context = RoutingContext(pins={"g": "large"})
        decision = route(group(), members(0, 0, b_health=Health.DOWN), PROFILE, 0.0, context)
        assert decision.chosen is None
        assert {r.reason for r in decision.rejected} == {Reason.UNHEALTHY, Reason.PINNED}

    def test_a_residency_member_that_is_not_awake_gets_nothing(self) -> None:
        """``RoutingContext.asleep``: a member of a residency set without the GPUs is dropped, with why;
        with none awake the request has no candidate."""
        why = "asleep: residency set 'cards' holds b awake"
        context = RoutingContext(asleep={"a": why})
        decision = route(features(), [snapshot("a"), snapshot("b", running=9)], PROFILE, 0.0, context)
        assert decision.chosen is not None
        assert decision.chosen.backend_id == "b"
        assert [(r.backend_id, r.reason, r.detail) for r in decision.rejected] == [("a", Reason.ASLEEP, why)]
        awake = route(features(), [snapshot("a"), snapshot("b", running=9)], PROFILE, 0.0)
        assert awake.chosen is not None
        assert awake.chosen.backend_id == "a"
        none = route(features(), [snapshot("a")], PROFILE, 0.0, context)
        assert none.chosen is None
        assert none.reason is Reason.NO_CANDIDATE

    def test_a_pin_of_another_group_or_a_plain_model_changes_nothing(self) -> None:
        context = RoutingContext(pins={"other": "large", "m": "large"})
        decision = route(group(), members(a_running=0, b_running=9), PROFILE, 0.0, context)
        assert model_of(decision) == "small"
        assert route(features(), [snapshot("x")], PROFILE, 0.0, context).chosen is not None


loads = st.tuples(st.integers(0, 50), st.integers(0, 50), st.sampled_from([None, 1, 2, 4]))


@given(st.lists(loads, min_size=1, max_size=5), st.integers(1, 40_000), st.sampled_from([None, 10, 4000]))
def test_properties(backends: list[tuple[int, int, int | None]], prompt: int, max_tokens: int | None) -> None:
    """Chosen is always eligible; same inputs give the same decision; scores are finite and in [0, 1]."""
    snapshots = [
        snapshot(f"b{i}", running=r, queued=q, slots=s, window=16_000 * (i + 1))
        for i, (r, q, s) in enumerate(backends)
    ]
    first = route(features(prompt, max_tokens), snapshots, PROFILE, 0.0)
    assert first == route(features(prompt, max_tokens), snapshots, PROFILE, 0.0)
    for candidate in first.candidates:
        assert 0.0 <= candidate.score <= 1.0
    if first.chosen is not None:
        window = first.chosen.context_window
        assert window is not None
        assert prompt + 1 <= window
        if any(prompt + max(max_tokens or 0, 1) <= 16_000 * (i + 1) for i in range(len(snapshots))):
            assert prompt + max(max_tokens or 0, 1) <= window
        best = max(c.score for c in first.candidates)
        assert next(c.score for c in first.candidates if c.deployment == first.chosen) == best
    else:
        assert len(first.rejected) == len(snapshots)


@given(st.integers(0, 30), st.integers(0, 30))
def test_score_monotone_in_queue(running: int, extra: int) -> None:
    """More work in flight never scores higher."""
    low = route(features(), [snapshot("a", running=running)], PROFILE, 0.0).candidates[0].score
    high = route(features(), [snapshot("a", running=running, queued=extra)], PROFILE, 0.0).candidates[0].score
    assert high <= low


def test_nan_inputs_never_poison_scores() -> None:
    base = snapshot("a")
    weird = replace(base, kv_usage=float("nan"))
    decision = route(features(), [weird], PROFILE, 0.0)
    assert decision.candidates[0].score == 1.0
