"""Why a request cannot be served, as its client should hear it: the decision's rejections turned
into the API error that names the cause (too long for every window, no model large enough, no
stored Responses, nothing healthy)."""

from __future__ import annotations

from backends.errors import UpstreamStatusError
from gateway.errors import (
    ContextLengthExceeded,
    GatewayError,
    InvalidRequest,
    ModelNotFound,
    NoBackendAvailable,
)
from policies import Decision, Endpoint, Reason, RequestFeatures
from policies.decision import Rejection
from policies.features import SIZE_FLOOR_HEADER

PROMPT_PARAM = {Endpoint.COMPLETIONS: "prompt", Endpoint.RESPONSES: "input"}
NOT_ASKED = (Reason.PINNED, Reason.KEEPS_MODEL, Reason.STAYS_HOME)
"""Rejections that say which candidates were not asked (a group's members, another llama-server than
a session's crowded home), not why a request cannot be served."""


def refusals(decision: Decision) -> tuple[Rejection, ...]:
    """The rejections that explain a refusal: a group's members left out by an admin's pin or a
    conversation's own member do not (a prompt too long for the pinned member is still an overflow)."""
    return tuple(r for r in decision.rejected if r.reason not in NOT_ASKED) or decision.rejected


def too_long_everywhere(decision: Decision) -> bool:
    """Refused because the prompt fits no window (and for nothing else)."""
    rejected = refusals(decision)
    return (
        decision.chosen is None
        and bool(rejected)
        and all(r.reason is Reason.CONTEXT_TOO_LONG for r in rejected)
    )


def no_route_error(
    decision: Decision, features: RequestFeatures, overflow: UpstreamStatusError | None = None
) -> GatewayError:
    """Why no backend can take the request, as the client should hear it (``overflow``: an engine
    refused the prompt as too long, and no other backend can take it)."""
    rejected = refusals(decision)
    too_long = [r for r in rejected if r.reason is Reason.CONTEXT_TOO_LONG]
    if overflow is not None or (rejected and len(too_long) == len(rejected)):
        return too_long_error(features, too_long, overflow)
    if not rejected:
        return ModelNotFound(f"No backend serves the model `{features.model}`.", param="model")
    if all(r.reason is Reason.BELOW_SIZE_FLOOR for r in rejected):
        return InvalidRequest(
            f"No model of `{features.model}` is large enough: {'; '.join(r.detail for r in rejected)}.",
            param=SIZE_FLOOR_HEADER,
        )
    if all(r.reason is Reason.UNSUPPORTED for r in rejected):
        return InvalidRequest(
            f"{rejected[0].detail}; send the whole input instead.", param="previous_response_id"
        )
    return NoBackendAvailable(f"No backend can take this request now: {decision.explanation}.")


def too_long_error(
    features: RequestFeatures, too_long: list[Rejection], overflow: UpstreamStatusError | None
) -> ContextLengthExceeded:
    """The prompt fits none of the model's backends: its tokens (the engine's count where one refused
    it) against the largest window there is."""
    prompt, windows = features.prompt_tokens, [r.window for r in too_long if r.window]
    details = [f"{r.backend_id}: {r.detail}" for r in too_long]
    if overflow is not None:
        counted, window = overflow.context_sizes()
        prompt = counted or prompt
        windows += [window] if window else []
        details.append(f"{overflow.backend_id}: {overflow.message}")
    return ContextLengthExceeded(
        f"turnout: too long for every backend serving `{features.model}`: {'; '.join(details)}",
        param=PROMPT_PARAM.get(features.endpoint, "messages"),
        prompt_tokens=prompt,
        window=max(windows) if windows else None,
    )
