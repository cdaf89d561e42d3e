"""Pure routing logic: features -> candidates -> scores -> decision, with reasons.

This package imports neither ``gateway`` nor ``backends`` (nor httpx, litestar or redis): it is
plain Python over frozen dataclasses, with the clock passed in.
"""

from policies.decision import Decision, Rejection, ScoredCandidate
from policies.features import extract
from policies.profiles import BUILTIN_PROFILES, Profile, ProfileError, build_profile
from policies.route import route
from policies.types import (
    Architecture,
    BackendSnapshot,
    Deployment,
    Endpoint,
    EngineKind,
    Health,
    Reason,
    RequestFeatures,
    SlotState,
    Usage,
)

__all__ = [
    "BUILTIN_PROFILES",
    "Architecture",
    "BackendSnapshot",
    "Decision",
    "Deployment",
    "Endpoint",
    "EngineKind",
    "Health",
    "Profile",
    "ProfileError",
    "Reason",
    "Rejection",
    "RequestFeatures",
    "ScoredCandidate",
    "SlotState",
    "Usage",
    "build_profile",
    "extract",
    "route",
]
