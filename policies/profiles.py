"""Profiles: named, declarative routing configurations built from the filter and scorer registries.

A profile lists filters (applied in order) and scorers with weights. Unknown names and scorers
without a positive weight are configuration errors, raised when the profile is built, never while
routing.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

import msgspec

from policies.scorers import SCORERS
from policies.stages import FILTER_NAMES, PICKERS
from policies.types import Reason

DEFAULT_FILTERS = ("engine-supports", "healthy", "context-fits")
COST_FILTERS = (*DEFAULT_FILTERS, "stays-home")
"""The cost profiles' filters: a crowded llama-server keeps its sessions (``policies.homes``)."""


class ProfileError(ValueError):
    """A profile names a filter or scorer that does not exist, or gives a bad weight."""


class Profile(msgspec.Struct, frozen=True):
    """A validated routing configuration."""

    name: str
    filters: tuple[str, ...]
    scorers: tuple[tuple[str, float], ...]
    reason: Reason  # the reason recorded when this profile picks among several candidates
    picker: str = "best-score"
    """How the winner is picked among the scored candidates (``policies.stages.PICKERS``)."""
    pins_slots: bool = True
    """Send a request to the llama.cpp slot the cost model chose (``id_slot``); False: let
    llama-server pick one by its own prompt similarity, as a router that cannot see slots does."""
    history: bool = False
    """Reads the router's own traffic (``RoutingContext.routers``: the gateway gathers it only for
    such profiles)."""
    warms: bool = False
    """Offers each candidate a llama.cpp slot to warm in the background for the session's next turn
    (``policies.warm``)."""


def build_profile(
    name: str,
    *,
    filters: Sequence[str] = DEFAULT_FILTERS,
    scorers: Mapping[str, float],
    reason: Reason = Reason.LEAST_LOADED,
    picker: str = "best-score",
    pins_slots: bool = True,
    history: bool = False,
    warms: bool = False,
) -> Profile:
    """Check names against the registries and return a :class:`Profile`."""
    if picker not in PICKERS:
        raise ProfileError(f"profile {name!r}: unknown picker {picker!r}; known: {sorted(PICKERS)}")
    for filter_name in filters:
        if filter_name not in FILTER_NAMES:
            raise ProfileError(
                f"profile {name!r}: unknown filter {filter_name!r}; known: {sorted(FILTER_NAMES)}"
            )
    if not scorers:
        raise ProfileError(f"profile {name!r}: needs at least one scorer")
    for scorer_name, weight in scorers.items():
        if scorer_name not in SCORERS:
            raise ProfileError(f"profile {name!r}: unknown scorer {scorer_name!r}; known: {sorted(SCORERS)}")
        if not weight > 0:
            raise ProfileError(
                f"profile {name!r}: scorer {scorer_name!r} needs a positive weight, got {weight}"
            )
    return Profile(
        name=name,
        filters=tuple(filters),
        scorers=tuple(scorers.items()),
        reason=reason,
        picker=picker,
        pins_slots=pins_slots,
        history=history,
        warms=warms,
    )


def _cost(name: str, objective: str, reason: Reason) -> Profile:
    """A cost profile: the cost model's ``objective`` scorer, session affinity as a tie-breaker,
    warm-ups on."""
    scorers = {objective: 1.0, "session-affinity": 0.001}
    return build_profile(name, filters=COST_FILTERS, scorers=scorers, reason=reason, warms=True)


BUILTIN_PROFILES: dict[str, Profile] = {
    "cost": _cost("cost", "answer", Reason.LOWEST_TTFT),  # route: the last token's reason for agents
    "cost-ttft": _cost("cost-ttft", "ttft", Reason.LOWEST_TTFT),
    "cost-completion": _cost("cost-completion", "completion", Reason.LOWEST_COMPLETION),
    "least-loaded": build_profile("least-loaded", scorers={"least-loaded": 1.0}),
    "round-robin": build_profile("round-robin", scorers={"round-robin": 1.0}, reason=Reason.ROUND_ROBIN),
    "prefer-vllm": build_profile(
        "prefer-vllm", scorers={"prefer-vllm": 1.0, "least-loaded": 0.01}, reason=Reason.PREFERRED_ENGINE
    ),
    "prefer-llamacpp": build_profile(
        "prefer-llamacpp",
        scorers={"prefer-llamacpp": 1.0, "least-loaded": 0.01},
        reason=Reason.PREFERRED_ENGINE,
    ),
}


def _peer(name: str, picker: str, scorers: Mapping[str, float]) -> Profile:
    """A published router's rules (``policies.peers``): its picker decides, from what the router sees;
    it pins no llama.cpp slot. ``scorers``: its weighted scores (a picker that does not read them
    still shows them in the decision log)."""
    return build_profile(
        name, scorers=scorers, reason=Reason.PEER_RULE, picker=picker, pins_slots=False, history=True
    )


PEER_PROFILES: dict[str, Profile] = {
    "llm-d": _peer("llm-d", "max-score-random", {"epp-prefix": 3.0, "epp-queue": 2.0, "epp-kv": 2.0}),
    "sglang-cache-aware": _peer("sglang-cache-aware", "sglang-cache-aware", {"least-busy": 1.0}),
    "dynamo-kv": _peer("dynamo-kv", "max-score-random", {"dynamo-kv-cost": 1.0}),
    "vllm-session": _peer("vllm-session", "vllm-session", {"least-busy": 1.0}),
    "vllm-prefixaware": _peer("vllm-prefixaware", "vllm-prefixaware", {"epp-prefix": 1.0}),
    "litellm-least-busy": _peer("litellm-least-busy", "litellm-least-busy", {"least-busy": 1.0}),
    "litellm-latency": _peer("litellm-latency", "litellm-latency", {"least-busy": 1.0}),
}
"""The published routers users would otherwise run, as profiles (``policies.peers`` cites each source)."""
BUILTIN_PROFILES.update(PEER_PROFILES)
