"""The route engine: candidates -> filters -> cost estimates -> weighted scorers -> pick.

``route`` is pure and deterministic: the same features, snapshots, context and profile give the
same decision. Ties keep the snapshot order (the order backends are configured in).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from types import MappingProxyType

import msgspec

from policies.cost import estimate
from policies.filters import FILTERS, Candidate
from policies.learning import LearnedState
from policies.profiles import Profile
from policies.scorers import SCORERS, CandidateView
from policies.slots import DEFAULT_LEASE_IDLE_S, free_slot, keep_chance
from policies.types import (
    BackendSnapshot,
    Decision,
    Deployment,
    EngineKind,
    PrefixMatch,
    Reason,
    Rejection,
    RequestFeatures,
    ScoredCandidate,
    SessionView,
    SlotLease,
)


class RoutingContext(msgspec.Struct, frozen=True):
    """What routing knows beyond the request and the snapshots: the session, slot leases, what each
    backend holds of the prompt (the prefix index), learning."""

    session: SessionView | None = None
    leases: Mapping[str, tuple[SlotLease, ...]] = msgspec.field(default_factory=lambda: MappingProxyType({}))
    learned: LearnedState = msgspec.field(default_factory=LearnedState)
    sequence: int = 0  # a request counter, for round-robin
    matches: Mapping[str, PrefixMatch] = msgspec.field(default_factory=lambda: MappingProxyType({}))
    lease_idle_s: float = DEFAULT_LEASE_IDLE_S
    drained: frozenset[str] = frozenset()  # backends an admin drained: no new requests
    live_sessions: int = 0  # sessions that sent a turn within ``lease_idle_s``, this one included
    follow_rate: float = 0.0
    """The chance a conversation known only by its content comes back after its first turn (learned
    by the gateway: ``gateway.live.FollowUps``); weighs a first turn's look-ahead while a slot is free."""
    pins: Mapping[str, str] = msgspec.field(default_factory=lambda: MappingProxyType({}))
    """Model group -> the one member an admin pinned it to (its other members get no requests)."""


def size_floor(
    features: RequestFeatures, candidates: list[Candidate]
) -> tuple[list[Candidate], list[Rejection]]:
    """Only models of at least ``features.min_params_b`` billion parameters (total); a model whose size
    is not configured cannot show it is large enough."""
    floor = features.min_params_b
    if floor is None:
        return candidates, []
    kept = [(d, s) for d, s in candidates if d.params_total_b is not None and d.params_total_b >= floor]
    dropped = [
        Rejection(
            s.backend_id, Reason.BELOW_SIZE_FLOOR, f"{d.model} has {_size(d)} parameters, {floor:g} B asked"
        )
        for d, s in candidates
        if (d, s) not in kept
    ]
    return kept, dropped


def _size(deployment: Deployment) -> str:
    size = deployment.params_total_b
    return "an unknown number of" if size is None else f"{size:g} B"


def keep_model(
    features: RequestFeatures, candidates: list[Candidate], session: SessionView | None
) -> tuple[list[Candidate], list[Rejection]]:
    """A conversation in a model group keeps the member that answered it, while that member has an
    eligible candidate: answers from one model throughout are what an agent expects. Otherwise (its
    window outgrown, its engines down or drained) every eligible member stays: the conversation
    moves, and the decision log says from which model to which (``gateway.routing``)."""
    model = session.model if session is not None else None
    if not features.members or model is None or model not in features.members:
        return candidates, []
    own = [(d, s) for d, s in candidates if d.model == model]
    if not own:
        return candidates, []
    others = [
        Rejection(s.backend_id, Reason.KEEPS_MODEL, f"the conversation keeps {model} (not {d.model})")
        for d, s in candidates
        if d.model != model
    ]
    return own, others


def pinned_member(
    features: RequestFeatures, candidates: list[Candidate], pins: Mapping[str, str]
) -> tuple[list[Candidate], list[Rejection]]:
    """A group an admin pinned to one member routes to that member only, conversations included."""
    member = pins.get(features.model) if features.members else None
    if member is None:
        return candidates, []
    others = [
        Rejection(s.backend_id, Reason.PINNED, f"{features.model} is pinned to {member} (not {d.model})")
        for d, s in candidates
        if d.model != member
    ]
    return [(d, s) for d, s in candidates if d.model == member], others


def prefer_default(features: RequestFeatures, scored: Sequence[ScoredCandidate], best: int) -> int | None:
    """The default member's best candidate when ``best`` is another member's that does not score
    ``features.prefer_default`` better than it (the size concern's fallback: absent a floor, or when the
    default member meets it, a group answers with its default member unless another is clearly
    faster); None: ``best`` stands."""
    if not features.members or features.prefer_default <= 0:
        return None
    default = features.members[0]
    if scored[best].deployment.model == default:
        return None
    own = [i for i, c in enumerate(scored) if c.deployment.model == default]
    if not own:
        return None
    mine = max(own, key=lambda i: (scored[i].score, -i))
    return mine if scored[best].score < scored[mine].score * (1.0 + features.prefer_default) else None


def _clamp(value: float) -> float:
    if value != value:  # NaN scores as the worst value, never poisons a sum
        return 0.0
    return 1.0 if value > 1.0 else value if value > 0.0 else 0.0


def route(
    features: RequestFeatures,
    snapshots: Sequence[BackendSnapshot],
    profile: Profile,
    now: float,
    context: RoutingContext | None = None,
) -> Decision:
    """Choose a deployment (and llama.cpp slot) for ``features`` under ``profile``."""
    context = context or RoutingContext()
    candidates: list[Candidate] = []
    for name in features.members or (features.model,):
        for snapshot in snapshots:
            deployment = snapshot.deployment_for(name)
            if deployment is not None:
                candidates.append((deployment, snapshot))
    if not candidates:
        return Decision(profile=profile.name, chosen=None, reason=Reason.NOT_SERVED)

    rejected: list[Rejection] = [
        Rejection(s.backend_id, Reason.DRAINED, "drained by an admin")
        for _, s in candidates
        if s.backend_id in context.drained
    ]
    candidates = [(d, s) for d, s in candidates if s.backend_id not in context.drained]
    for filter_name in profile.filters:
        candidates, dropped = FILTERS[filter_name](features, candidates)
        rejected.extend(dropped)
    if not candidates:
        return Decision(profile.name, None, Reason.NO_CANDIDATE, rejected=tuple(rejected))
    candidates, small = size_floor(features, candidates)
    rejected.extend(small)
    if not candidates:
        return Decision(profile.name, None, Reason.NO_CANDIDATE, rejected=tuple(rejected))
    candidates, not_pinned = pinned_member(features, candidates, context.pins)
    rejected.extend(not_pinned)
    if not candidates:
        return Decision(profile.name, None, Reason.NO_CANDIDATE, rejected=tuple(rejected))
    candidates, kept_out = keep_model(features, candidates, context.session)
    rejected.extend(kept_out)

    slots = sum(s.total_slots or len(s.slots) for _, s in candidates if s.kind is EngineKind.LLAMACPP)
    keep = keep_chance(context.session, context.leases, slots, context.live_sessions)
    follow = context.follow_rate if free_slot([s for _, s in candidates], context.leases) else 0.0
    views = [
        CandidateView(
            deployment,
            snapshot,
            estimate(
                features,
                deployment,
                snapshot,
                session=context.session,
                leases=context.leases.get(snapshot.backend_id, ()),
                learned=context.learned,
                match=context.matches.get(snapshot.backend_id),
                now=now,
                lease_idle_s=context.lease_idle_s,
                keep=keep,
                follow=follow,
            ),
        )
        for deployment, snapshot in candidates
    ]
    total_weight = sum(weight for _, weight in profile.scorers)
    names = [name for name, _ in profile.scorers]
    weights = [weight for _, weight in profile.scorers]
    columns = [[_clamp(v) for v in SCORERS[name](features, views, context.sequence)] for name in names]
    scored: list[ScoredCandidate] = []
    for view, values in zip(views, zip(*columns, strict=True), strict=True):
        score = sum(value * weight for value, weight in zip(values, weights, strict=True))
        components = tuple(zip(names, values, strict=True))
        scored.append(ScoredCandidate(view.deployment, score / total_weight, components, view.estimate))

    best = max(range(len(scored)), key=lambda i: (scored[i].score, -i))
    reason = Reason.ONLY_CANDIDATE if len(scored) == 1 else profile.reason
    default = prefer_default(features, scored, best)
    if default is not None:
        best, reason = default, Reason.DEFAULT_MEMBER
    return Decision(profile.name, scored[best].deployment, reason, tuple(scored), tuple(rejected))
