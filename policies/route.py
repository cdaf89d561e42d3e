"""The route engine: candidates -> stages -> cost estimates (-> warm-ups) -> weighted scorers -> picker.

Every step is named: the stages (``policies.stages``: the built-in ones around the profile's
filters), the scorers (``policies.scorers``) and the picker (``policies.stages.PICKERS``). ``route``
is pure and deterministic: the same features, snapshots, context and profile give the same decision.
Ties keep the snapshot order (the order backends are configured in).
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Sequence

from msgspec.structs import replace

from policies.awaited import in_session
from policies.coming import NextTurn
from policies.context import RoutingContext
from policies.cost import estimate
from policies.decision import Decision, Rejection, ScoredCandidate
from policies.filters import Candidate
from policies.homes import sharing
from policies.ledger import IDLE
from policies.profiles import Profile
from policies.scorers import SCORERS
from policies.slots import free_slot, keep_chance, proven
from policies.stages import PICKERS, stages
from policies.types import Awaited, BackendSnapshot, EngineKind, Reason, RequestFeatures
from policies.views import CandidateView
from policies.warm import with_warm_ups

__all__ = ["RoutingContext", "route"]


def _clamp(value: float) -> float:
    if value != value:  # NaN scores as the worst value, never poisons a sum
        return 0.0
    return 1.0 if value > 1.0 else value if value > 0.0 else 0.0


def pooled_arrivals(candidates: Sequence[Candidate]) -> list[Candidate]:
    """Each candidate's ``arrivals_per_s`` as the mean of its engine kind's among the candidates: the
    requests to come are the router's to place, and interchangeable engines share them; one engine's
    own recent count (a few requests in ``ARRIVALS_WINDOW_S`` on a large fleet) is noise, and priced
    by it a long prompt went behind an 18 s queue where an 8 s one was free (mooncake-8vllm)."""
    rates: dict[EngineKind, list[float]] = {}
    for _, snapshot in candidates:
        rates.setdefault(snapshot.kind, []).append(snapshot.arrivals_per_s)
    mean = {kind: sum(values) / len(values) for kind, values in rates.items()}
    return [
        (deployment, replace(snapshot, arrivals_per_s=mean[snapshot.kind]))
        if snapshot.arrivals_per_s != mean[snapshot.kind]
        else (deployment, snapshot)
        for deployment, snapshot in candidates
    ]


def pooled_turns(
    candidates: Sequence[Candidate], context: RoutingContext
) -> dict[EngineKind, tuple[NextTurn, ...]]:
    """The other sessions' next turns (``policies.coming``) pooled over the candidates of each engine
    kind: each candidate is priced by the kind's mean (a turn counts ``share`` = 1 / candidates of
    the kind). Where a session is at home among equal replicas is the router's to change, and one
    replica's residents of the moment (one agent gone quiet there) are noise that moved sessions off
    their warm caches."""
    turns: dict[EngineKind, list[NextTurn]] = {}
    for _, snapshot in candidates:
        turns.setdefault(snapshot.kind, []).extend(context.coming.get(snapshot.backend_id, ()))
    return {kind: tuple(found) for kind, found in turns.items()}


def route(
    features: RequestFeatures,
    snapshots: Sequence[BackendSnapshot],
    profile: Profile,
    now: float,
    context: RoutingContext | None = None,
) -> Decision:
    """Choose a deployment (and llama.cpp slot) for ``features`` under ``profile``."""
    context = context or RoutingContext()
    features = in_session(features, context.session)  # an agent's session waits for the last token
    candidates: list[Candidate] = []
    for name in features.members or (features.model,):
        for snapshot in snapshots:
            deployment = snapshot.deployment_for(name)
            if deployment is not None:
                candidates.append((deployment, snapshot))
    if not candidates:
        return Decision(profile=profile.name, chosen=None, reason=Reason.NOT_SERVED)
    rejected: list[Rejection] = []
    for _, stage in stages(profile.filters):
        candidates, dropped = stage(features, candidates, context)
        rejected.extend(dropped)
        if not candidates:
            return Decision(profile.name, None, Reason.NO_CANDIDATE, rejected=tuple(rejected))

    candidates = pooled_arrivals(candidates)
    coming = pooled_turns(candidates, context)
    kinds = Counter(snapshot.kind for _, snapshot in candidates)
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
                sharing=sharing(snapshot, context.homes, context.session),
                coming=coming[snapshot.kind],
                share=1.0 / kinds[snapshot.kind],
            ),
            match=context.matches.get(snapshot.backend_id),
            router=context.routers.get(snapshot.backend_id, IDLE),
        )
        for deployment, snapshot in candidates
    ]
    session = context.session
    if profile.warms and proven(features, session):
        think = max(now - session.last_seen, 0.0) if session is not None and session.turns else 0.0
        views = with_warm_ups(views, proven=True, think_s=think)
    total_weight = sum(weight for _, weight in profile.scorers)
    names = [name for name, _ in profile.scorers]
    weights = [weight for _, weight in profile.scorers]
    columns = [[_clamp(v) for v in SCORERS[name](features, views, context.sequence)] for name in names]
    scored: list[ScoredCandidate] = []
    for view, values in zip(views, zip(*columns, strict=True), strict=True):
        score = sum(value * weight for value, weight in zip(values, weights, strict=True))
        components = tuple(zip(names, values, strict=True))
        scored.append(ScoredCandidate(view.deployment, score / total_weight, components, view.estimate))

    best, picked = PICKERS[profile.picker](features, scored, views, context.sequence)
    objective, why = _objective(features, names)
    chosen_by = Reason.LOWEST_COMPLETION if objective == Awaited.LAST_TOKEN.value else profile.reason
    reason = Reason.ONLY_CANDIDATE if len(scored) == 1 else picked or chosen_by
    return Decision(
        profile.name,
        scored[best].deployment,
        reason,
        tuple(scored),
        tuple(rejected),
        pinned=profile.pins_slots,
        follow_rate=context.follow_rate if session is not None and not proven(features, session) else None,
        objective=objective,
        objective_why=why,
    )


def _objective(features: RequestFeatures, scorers: Sequence[str]) -> tuple[str, str]:
    """What the cost scorers compared (``Decision.objective``) and why."""
    if "answer" in scorers:
        last = features.awaited is Awaited.LAST_TOKEN
        return features.awaited.value, features.awaited_why if last else ""
    if "completion" in scorers:
        return Awaited.LAST_TOKEN.value, "the profile's objective (cost-completion)"
    if "ttft" in scorers:
        return Awaited.FIRST_TOKEN.value, ""
    return "", ""
