"""What next after a request failed before its first byte: the one step the relay (``Lifecycle.open``)
and the virtual replay share, pure (it decides; the caller acts on the fleet).

An engine that failed a request before any byte reached the client may be replaced: the request is
routed again without that backend, within ``limits.retries``. A prompt the engine refused as longer
than its window goes elsewhere on the engine's own count (``engine_counted``). How the failure
reflects on the engine (its circuit breaker, and whether it is unreachable) comes with the verdict.
"""

from __future__ import annotations

import msgspec

from backends.errors import UpstreamError, UpstreamStatusError, UpstreamUnavailable
from gateway.errors import GatewayError
from gateway.refusals import no_route_error
from gateway.routed import Routed, engine_counted


def engine_fault(exc: UpstreamError) -> str | None:
    """How a failure reflects on the engine (circuit breaking): unreachable, hung, a 5xx or a stream
    that broke off or stalled are its fault; a 4xx (a bad or too long request) is not."""
    if isinstance(exc, UpstreamStatusError):
        return exc.message if exc.status >= 500 else None
    return exc.message


def overflowed(exc: BaseException | None) -> bool:
    """The engine refused the prompt as longer than its window: another backend may have a larger one."""
    return isinstance(exc, UpstreamStatusError) and exc.context_exceeded


class AfterFailure(msgspec.Struct, frozen=True):
    """The verdict on one failed attempt."""

    fault: str | None
    """The engine's fault, for its circuit breaker (None: the request's, as a 4xx is)."""
    unreachable: bool
    """The engine could not be reached: avoid it until a probe finds it again."""
    retry: Routed | None
    """Route this again without ``exclude`` (the engine's count in it after an overflow); None: give up."""
    exclude: str


def after_failure(exc: UpstreamError, routed: Routed, attempt: int, retries: int) -> AfterFailure:
    """The verdict on attempt number ``attempt`` (from 1) of a request routed along ``routed``, which
    failed with ``exc`` before any byte, when ``retries`` more attempts are allowed in all."""
    if overflowed(exc):
        assert isinstance(exc, UpstreamStatusError)
        routed = engine_counted(routed, exc)
    retryable = bool(getattr(exc, "retryable", False)) or overflowed(exc)
    return AfterFailure(
        fault=engine_fault(exc),
        unreachable=isinstance(exc, UpstreamUnavailable),
        retry=routed if retryable and attempt <= retries else None,
        exclude=exc.backend_id,
    )


def gave_up(routed: Routed, last: UpstreamError | None) -> GatewayError | UpstreamError:
    """The error a request ends with when routing again found no backend: too long everywhere when an
    engine refused it as such, the last engine's failure otherwise, else the decision's refusal."""
    if overflowed(last):
        assert isinstance(last, UpstreamStatusError)
        return no_route_error(routed.decision, routed.features, last)
    if last is not None:
        return last
    return no_route_error(routed.decision, routed.features)
