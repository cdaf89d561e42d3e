"""The route's built-in stages: the filters every profile runs around its own, and its pickers.

``route`` runs, in order, ``BEFORE_PROFILE``, the profile's own filters (``policies.filters``),
then ``AFTER_PROFILE``; each stage takes the request's features, the remaining candidates and the
:class:`RoutingContext` and returns the candidates it keeps with a :class:`Rejection` for each one it
drops (the decision log shows every one). Scored candidates then go to the profile's picker
(``PICKERS``, by name), which names the winner and the reason recorded for it.
"""

from __future__ import annotations

import functools
from collections.abc import Callable, Sequence

from policies.context import RoutingContext
from policies.decision import Rejection, ScoredCandidate
from policies.filters import FILTERS, Candidate, FilterResult
from policies.homes import stays_home
from policies.peers import PEER_PICKERS
from policies.types import Deployment, Reason, RequestFeatures
from policies.views import CandidateView, Pick

Stage = Callable[[RequestFeatures, Sequence[Candidate], RoutingContext], FilterResult]


def not_drained(
    features: RequestFeatures, candidates: Sequence[Candidate], context: RoutingContext
) -> FilterResult:
    """Backends an admin drained get no new requests."""
    dropped = [
        Rejection(s.backend_id, Reason.DRAINED, "drained by an admin")
        for _, s in candidates
        if s.backend_id in context.drained
    ]
    return [(d, s) for d, s in candidates if s.backend_id not in context.drained], dropped


def awake(
    features: RequestFeatures, candidates: Sequence[Candidate], context: RoutingContext
) -> FilterResult:
    """A member of a residency set that does not hold the GPUs now (asleep, or in a switch) gets no
    requests: a sleeping vLLM fails them, an unloaded llama-server model has nothing to answer with."""
    dropped = [
        Rejection(s.backend_id, Reason.ASLEEP, context.asleep[s.backend_id])
        for _, s in candidates
        if s.backend_id in context.asleep
    ]
    return [(d, s) for d, s in candidates if s.backend_id not in context.asleep], dropped


def above_size_floor(
    features: RequestFeatures, candidates: Sequence[Candidate], context: RoutingContext
) -> FilterResult:
    """Only models of at least ``features.min_params_b`` billion parameters (total); a model whose size
    is not configured cannot show it is large enough."""
    floor = features.min_params_b
    if floor is None:
        return list(candidates), []
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


def pinned_member(
    features: RequestFeatures, candidates: Sequence[Candidate], context: RoutingContext
) -> FilterResult:
    """A group an admin pinned to one member routes to that member only, conversations included."""
    member = context.pins.get(features.model) if features.members else None
    if member is None:
        return list(candidates), []
    others = [
        Rejection(s.backend_id, Reason.PINNED, f"{features.model} is pinned to {member} (not {d.model})")
        for d, s in candidates
        if d.model != member
    ]
    return [(d, s) for d, s in candidates if d.model == member], others


def keeps_model(
    features: RequestFeatures, candidates: Sequence[Candidate], context: RoutingContext
) -> FilterResult:
    """A conversation in a model group keeps the member that answered it, while that member has an
    eligible candidate: answers from one model throughout are what an agent expects. Otherwise (its
    window outgrown, its engines down or drained) every eligible member stays: the conversation
    moves, and the decision log says from which model to which (``gateway.routing``)."""
    session = context.session
    model = session.model if session is not None else None
    if not features.members or model is None or model not in features.members:
        return list(candidates), []
    own = [(d, s) for d, s in candidates if d.model == model]
    if not own:
        return list(candidates), []
    others = [
        Rejection(s.backend_id, Reason.KEEPS_MODEL, f"the conversation keeps {model} (not {d.model})")
        for d, s in candidates
        if d.model != model
    ]
    return own, others


BEFORE_PROFILE: tuple[tuple[str, Stage], ...] = (("not-drained", not_drained), ("awake", awake))
"""Stages before the profile's filters."""
AFTER_PROFILE: tuple[tuple[str, Stage], ...] = (
    ("size-floor", above_size_floor),
    ("pinned-member", pinned_member),
    ("keeps-model", keeps_model),
)
"""Stages after the profile's filters, in this order: a pin or a conversation's own member is chosen
among the members large enough."""


CONTEXT_FILTERS: dict[str, Stage] = {"stays-home": stays_home}
"""Filters a profile may name that read the routing context (``policies.homes``: the cost profiles)."""
FILTER_NAMES = frozenset(FILTERS) | frozenset(CONTEXT_FILTERS)
"""Every filter a profile may name."""


def profile_filter(name: str) -> Stage:
    """A profile's filter as a stage: one of ``CONTEXT_FILTERS`` as it is, one of
    ``policies.filters.FILTERS`` reading no context."""
    if name in CONTEXT_FILTERS:
        return CONTEXT_FILTERS[name]
    check = FILTERS[name]

    def stage(
        features: RequestFeatures, candidates: Sequence[Candidate], context: RoutingContext
    ) -> FilterResult:
        return check(features, candidates)

    stage.__name__ = name
    return stage


@functools.cache
def stages(filters: tuple[str, ...]) -> tuple[tuple[str, Stage], ...]:
    """Every stage a profile with ``filters`` runs, in order (built once per list of filters)."""
    return (*BEFORE_PROFILE, *((name, profile_filter(name)) for name in filters), *AFTER_PROFILE)


Picker = Callable[[RequestFeatures, Sequence[ScoredCandidate], Sequence[CandidateView], int], Pick]
"""``(features, scored, views, sequence)``: the scored candidates, the same candidates as the scorers
saw them (their snapshots, prefix matches and router views), and the request counter."""


def best_score(
    features: RequestFeatures,
    scored: Sequence[ScoredCandidate],
    views: Sequence[CandidateView],
    sequence: int,
) -> Pick:
    """The highest score (ties: the first, in the order backends are configured); in a model group,
    its default member's best candidate unless another member scores ``features.prefer_default``
    better than it (the size concern's fallback: absent a floor, or when the default member meets it,
    a group answers with its default member unless another is clearly faster)."""
    best = max(range(len(scored)), key=lambda i: (scored[i].score, -i))
    if not features.members or features.prefer_default <= 0:
        return best, None
    default = features.members[0]
    if scored[best].deployment.model == default:
        return best, None
    own = [i for i, c in enumerate(scored) if c.deployment.model == default]
    if not own:
        return best, None
    mine = max(own, key=lambda i: (scored[i].score, -i))
    if scored[best].score < scored[mine].score * (1.0 + features.prefer_default):
        return mine, Reason.DEFAULT_MEMBER
    return best, None


PICKERS: dict[str, Picker] = {"best-score": best_score, **PEER_PICKERS}
"""Pickers a profile may name (``Profile.picker``; the published routers' own: ``policies.peers``)."""
