"""The request path: parse, route, send (re-routing only before the first byte), relay, record.

read body -> parse -> resolve model -> extract features -> route -> adapter.prepare
  -> adapter.send (retry on another backend while nothing reached the client)
  -> stream events through / return the body -> canonical log line
"""

from __future__ import annotations

import time
from collections.abc import AsyncIterator
from dataclasses import dataclass
from typing import Any

import structlog
from litestar import Request, Response
from litestar.background_tasks import BackgroundTask
from litestar.response import Stream
from tenacity import AsyncRetrying, retry_if_exception, stop_after_attempt

from backends.errors import UpstreamError, UpstreamStreamError, UpstreamUnavailable
from backends.fleet import Fleet
from backends.stream import ResponseRelay
from gateway.catalog import Catalog
from gateway.disconnect import ClientDisconnected, DisconnectWatch
from gateway.errors import (
    ContextLengthExceeded,
    GatewayError,
    ModelNotFound,
    NoBackendAvailable,
    UpstreamFailed,
    from_upstream,
    openai_error_body,
)
from gateway.record import RequestRecord
from gateway.requests import parse_body, read_body
from policies import Decision, Endpoint, Profile, Reason, RequestFeatures, extract, route

log = structlog.get_logger(__name__)

SSE_HEADERS = {"cache-control": "no-cache", "x-accel-buffering": "no"}
CLIENT_CLOSED = 499  # nginx's status for "client closed request", used in logs only


def _retryable(exc: BaseException) -> bool:
    return isinstance(exc, UpstreamError) and bool(getattr(exc, "retryable", False))


def no_route_error(decision: Decision, features: RequestFeatures) -> GatewayError:
    """Why no backend can take the request, as the client should hear it."""
    rejected = decision.rejected
    if not rejected:
        return ModelNotFound(f"No backend serves the model `{features.model}`.", param="model")
    if all(r.reason is Reason.CONTEXT_TOO_LONG for r in rejected):
        details = "; ".join(f"{r.backend_id}: {r.detail}" for r in rejected)
        return ContextLengthExceeded(
            f"This request is too long for every backend serving `{features.model}` ({details}).",
            param="messages" if features.endpoint is Endpoint.CHAT else "prompt",
        )
    return NoBackendAvailable(f"No backend can take this request now: {decision.explanation}.")


@dataclass(frozen=True, slots=True)
class Opened:
    decision: Decision
    relay: ResponseRelay


class Relay:
    """Everything one request needs, built once at start-up and shared by all requests."""

    def __init__(
        self, fleet: Fleet, catalog: Catalog, profile: Profile, *, retries: int, max_body: int
    ) -> None:
        self.fleet = fleet
        self.catalog = catalog
        self.profile = profile
        self.retries = retries
        self.max_body = max_body

    def decide(self, features: RequestFeatures, excluded: frozenset[str] = frozenset()) -> Decision:
        snapshots = [s for s in self.fleet.snapshots() if s.backend_id not in excluded]
        return route(features, snapshots, self.profile, time.time())

    async def open(
        self, endpoint: Endpoint, body: dict[str, Any], features: RequestFeatures, record: RequestRecord
    ) -> Opened:
        """Route and send; on a failure before any byte, exclude that backend and route again."""
        excluded: set[str] = set()
        last_error: UpstreamError | None = None
        retrying = AsyncRetrying(
            stop=stop_after_attempt(self.retries + 1), retry=retry_if_exception(_retryable), reraise=True
        )
        try:
            async for attempt in retrying:
                with attempt:
                    decision = self.decide(features, frozenset(excluded))
                    if decision.chosen is None:
                        if last_error is not None:
                            raise last_error
                        raise no_route_error(decision, features)
                    record.backend, record.reason = decision.chosen.backend_id, decision.reason.value
                    adapter = self.fleet.adapter(decision.chosen.backend_id)
                    upstream = adapter.prepare(endpoint, body, decision.chosen, body["model"])
                    try:
                        response = await adapter.send(upstream)
                    except UpstreamError as exc:
                        if _retryable(exc):
                            excluded.add(exc.backend_id)
                            last_error = exc
                            record.retries = attempt.retry_state.attempt_number
                            log.warning("upstream.failed", backend=exc.backend_id, error=exc.message)
                        if isinstance(exc, UpstreamUnavailable):  # unreachable: avoid until probed again
                            self.fleet.report_failure(exc.backend_id, exc.message)
                        raise
                    return Opened(decision, ResponseRelay(upstream, response))
        except UpstreamError as exc:
            raise from_upstream(exc) from exc
        raise AssertionError("unreachable: tenacity either returns or re-raises")  # pragma: no cover

    async def handle(self, request: Request[Any, Any, Any], endpoint: Endpoint) -> Response[Any]:
        record = RequestRecord(endpoint=endpoint.value)
        watch: DisconnectWatch | None = None
        try:
            body = parse_body(await read_body(request, self.max_body), endpoint)
            model = self.catalog.resolve(body["model"])
            record.model, record.stream = model.name, bool(body.get("stream"))
            features = extract(body, endpoint, model=model.name, chars_per_token=model.chars_per_token)
            watch = DisconnectWatch(request.receive)
            opened = await watch.run(self.open(endpoint, body, features, record))
            headers = {
                "x-turnout-backend": opened.decision.chosen.backend_id if opened.decision.chosen else "",
                "x-turnout-route-reason": opened.decision.reason.value,
            }
            if opened.relay.request.stream:
                await watch.stop()
                return Stream(
                    self._stream(opened.relay, record),
                    media_type="text/event-stream",
                    headers={**SSE_HEADERS, **headers},
                    background=BackgroundTask(self._finish_stream, opened.relay, record),
                )
            try:
                content = await watch.run(opened.relay.body())
            finally:
                await opened.relay.aclose()
            record.first_byte_at, record.usage = opened.relay.first_byte_at, opened.relay.usage
            record.emit()
            return Response(content, media_type="application/json", headers=headers)
        except ClientDisconnected:
            record.status, record.error = CLIENT_CLOSED, "client disconnected"
            record.emit()
            return Response(b"", status_code=CLIENT_CLOSED)
        except UpstreamStreamError as exc:
            error = UpstreamFailed(f"backend {exc.backend_id} failed: {exc.message}")
            record.status, record.error = error.status, error.message
            record.emit()
            raise error from exc
        except GatewayError as exc:
            record.status, record.error = exc.status, exc.message
            record.emit()
            raise
        finally:
            if watch is not None:
                await watch.stop()

    async def _stream(self, relay: ResponseRelay, record: RequestRecord) -> AsyncIterator[bytes]:
        """Relay events; a failure after the first byte becomes an error event, then a clean end."""
        try:
            async for events in relay.events():
                yield events
        except UpstreamStreamError as exc:
            record.error = exc.message
            message = f"backend {exc.backend_id} failed mid-stream: {exc.message}"
            yield (
                b"data: "
                + openai_error_body(message, UpstreamFailed.type, None, UpstreamFailed.code)
                + b"\n\n"
            )
            yield b"data: [DONE]\n\n"
        finally:
            await relay.aclose()

    async def _finish_stream(self, relay: ResponseRelay, record: RequestRecord) -> None:
        """Runs after the stream ended or the client left: close upstream, write the log line."""
        await relay.aclose()
        record.first_byte_at, record.usage = relay.first_byte_at, relay.usage
        if not relay.finished and record.error is None:
            record.status, record.error = CLIENT_CLOSED, "client disconnected"
        record.emit()
