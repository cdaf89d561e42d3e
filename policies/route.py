"""The route engine: candidates -> filters -> weighted scorers -> pick, with every reason kept.

``route`` is pure and deterministic: the same features, snapshots and profile give the same
decision. Ties keep the snapshot order (the order backends are configured in).
"""

from __future__ import annotations

from collections.abc import Sequence

from policies.filters import FILTERS, Candidate
from policies.profiles import Profile
from policies.scorers import SCORERS
from policies.types import BackendSnapshot, Decision, Reason, Rejection, RequestFeatures, ScoredCandidate


def _clamp(value: float) -> float:
    if value != value:  # NaN scores as the worst value, never poisons a sum
        return 0.0
    return min(1.0, max(0.0, value))


def route(
    features: RequestFeatures,
    snapshots: Sequence[BackendSnapshot],
    profile: Profile,
    now: float,
) -> Decision:
    """Choose a deployment for ``features`` among ``snapshots`` under ``profile``."""
    candidates: list[Candidate] = []
    for snapshot in snapshots:
        deployment = snapshot.deployment_for(features.model)
        if deployment is not None:
            candidates.append((deployment, snapshot))
    if not candidates:
        return Decision(profile=profile.name, chosen=None, reason=Reason.NOT_SERVED)

    rejected: list[Rejection] = []
    for filter_name in profile.filters:
        candidates, dropped = FILTERS[filter_name](features, candidates)
        rejected.extend(dropped)
    if not candidates:
        return Decision(profile.name, None, Reason.NO_CANDIDATE, rejected=tuple(rejected))

    total_weight = sum(weight for _, weight in profile.scorers)
    scored: list[ScoredCandidate] = []
    for deployment, snapshot in candidates:
        components = tuple(
            (name, _clamp(SCORERS[name](features, deployment, snapshot))) for name, _ in profile.scorers
        )
        score = sum(
            value * weight for (_, value), (_, weight) in zip(components, profile.scorers, strict=True)
        )
        scored.append(ScoredCandidate(deployment, score / total_weight, components))

    best = max(range(len(scored)), key=lambda i: (scored[i].score, -i))
    reason = Reason.ONLY_CANDIDATE if len(scored) == 1 else profile.reason
    return Decision(profile.name, scored[best].deployment, reason, tuple(scored), tuple(rejected))
