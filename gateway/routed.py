"""A routing decision with the session it was made for (``Routed``), as it travels a request's
lifecycle: routed, maybe re-routed after an engine refused it (``engine_counted``), settled."""

from __future__ import annotations

import msgspec
from msgspec.structs import replace

from backends.errors import UpstreamStatusError
from policies import Decision, RequestFeatures
from policies.decision import WarmUp
from policies.types import SessionView


class Routed(msgspec.Struct, frozen=True):
    """A decision with the session it was made for."""

    decision: Decision
    features: RequestFeatures
    session: SessionView | None
    overflowed: tuple[str, ...] = ()
    """Backends whose engine refused the prompt as longer than its window (re-routed from there)."""
    warm: WarmUp | None = None
    """The llama.cpp slot to prefill the prompt into in the background (``policies.warm``), held for
    the session where it is proven to continue."""
    output_capped: tuple[int, int] | None = None
    """The output limit the request asked for and the model's it was lowered to, where it asked more."""
    residency_wait_s: float | None = None
    """How long the request waited for a residency switch to wake its backend (``gateway.residency``)."""


def engine_counted(routed: Routed, error: UpstreamStatusError) -> Routed:
    """``routed`` after its engine refused the prompt as too long: the engine's count replaces the
    estimate, and that backend is noted as outgrown."""
    counted, _ = error.context_sizes()
    features = routed.features
    if counted is not None:
        features = replace(features, prompt_tokens=counted, prompt_exact=True, prompt_counted="counted")
    return replace(routed, features=features, overflowed=(*routed.overflowed, error.backend_id))
