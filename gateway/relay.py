"""The HTTP front of a request's lifecycle (``gateway.lifecycle``): read and parse the body, admit
its key, route once, open (re-routed only before the first byte), relay the stream or the body,
settle once, one log line.

read body -> parse -> admit -> Lifecycle.route -> Lifecycle.open -> stream events / return the body
  -> Lifecycle.settle (gateway.completion: decision log, learning, timeline, session, recording)
  -> the access release and the canonical log line (with its metrics)
"""

from __future__ import annotations

import asyncio
import math
from collections.abc import AsyncIterator
from typing import Any

import structlog
from litestar import Request, Response
from litestar.background_tasks import BackgroundTask

from backends.errors import UpstreamStreamError
from backends.watchdog import Expired, Watchdog
from gateway.completion import Completion, measured
from gateway.core import Core
from gateway.disconnect import ClientDisconnected, DisconnectWatch
from gateway.errors import GatewayError, ShuttingDown, UpstreamFailed, stream_api, stream_error_event
from gateway.lifecycle import Opened
from gateway.record import RequestRecord
from gateway.requests import parse_body, read_body
from gateway.routed import Routed
from gateway.streaming import EventStream
from policies import Endpoint

log = structlog.get_logger(__name__)

SSE_HEADERS = {"cache-control": "no-cache", "x-accel-buffering": "no"}
CLIENT_CLOSED = 499  # nginx's status for "client closed request", used in logs only


class Relay:
    """The HTTP requests of one gateway, on its core (``gateway.core``)."""

    def __init__(self, core: Core) -> None:
        self.core = core
        self.lifecycle = core.lifecycle
        self.fleet = core.fleet
        self.access = core.access
        self.metrics = core.metrics
        limits = core.settings.limits
        self.max_body = limits.max_body_bytes
        self.body_timeout_s = limits.body_timeout_s
        self.draining = False
        """Shutting down: new requests get 503 (``drain``)."""
        self._streams: set[Watchdog] = set()  # the streams being relayed, to end at the grace's end

    async def handle(self, request: Request[Any, Any, Any], endpoint: Endpoint) -> Response[Any]:
        clock = self.fleet.clock.monotonic
        record = RequestRecord(endpoint.value, clock(), observer=self._observe, clock=clock)
        watch: DisconnectWatch | None = None
        routed: Routed | None = None
        try:
            if self.draining:
                raise ShuttingDown("turnout is shutting down: send this request again (another replica)")
            key = self.access.authenticate(request.headers)
            record.key = key.name if key else None
            body = parse_body(await read_body(request, self.max_body, self.body_timeout_s), endpoint)
            record.ticket = await self.access.admit(key, self.core.catalog.resolve(body["model"]).name)
            record.stream = bool(body.get("stream"))
            routed = await self.lifecycle.route(body, endpoint, request.headers)
            record.model = routed.features.model
            watch = DisconnectWatch(request.receive)
            opened = await watch.run(self.lifecycle.open(endpoint, body, routed, record))
            headers = self._headers(opened)
            if opened.relay.request.stream:
                await watch.stop()
                return EventStream(
                    self._stream(opened, record, stream_api(endpoint)),
                    media_type="text/event-stream",
                    headers={**SSE_HEADERS, **headers},
                    background=BackgroundTask(self._finish_stream, opened, record),
                )
            shared = False
            try:
                content = await watch.run(opened.relay.body())
                self.fleet.judge(opened.relay.request.backend_id, None)
            except UpstreamStreamError as exc:
                self.fleet.judge(exc.backend_id, exc.message)
                raise
            finally:
                await opened.relay.aclose()
                shared = self.fleet.end(opened.token)
            await self._complete(opened, record, shared)
            return Response(content, media_type="application/json", headers=headers)
        except ClientDisconnected:
            record.status, record.error = CLIENT_CLOSED, "client disconnected"
            await self._end(record)
            return Response(b"", status_code=CLIENT_CLOSED)
        except UpstreamStreamError as exc:
            if routed is not None:
                await self._engine_lost(routed, exc)
            error = UpstreamFailed(f"backend {exc.backend_id} failed: {exc.message}")
            record.status, record.error = error.status, error.message
            await self._end(record)
            raise error from exc
        except GatewayError as exc:
            record.status, record.error = exc.status, exc.message
            await self._end(record)
            if record.backend is not None:  # an engine's answer: say whose, and why it was chosen
                exc.routing = {
                    "x-turnout-backend": record.backend,
                    "x-turnout-route-reason": record.reason or "",
                }
            if routed is not None:  # routed, then refused or failed before any byte: log the decision too
                await self.lifecycle.settle(Completion(routed, record.request_id, exc.status, exc.message))
            raise
        finally:
            if watch is not None:
                await watch.stop()

    async def drain(self, grace_s: float, poll_s: float = 0.1) -> None:
        """Shut down gently: refuse new requests (503), let those in flight finish for ``grace_s``,
        then end the streams still running with their API's error event."""
        self.draining = True
        await self.lifecycle.warming.close()  # no client waits for a warm-up: not worth the grace
        await self._settled(grace_s, poll_s)
        for dog in list(self._streams):
            dog.expire("turnout is shutting down")
        await self._settled(5.0, poll_s)  # the error events go out

    async def _settled(self, within_s: float, poll_s: float) -> None:
        """Until no request is in flight upstream, or ``within_s`` passed."""
        for _ in range(max(1, math.ceil(within_s / poll_s))):
            if not self.fleet.load():
                return
            await asyncio.sleep(poll_s)

    async def _engine_lost(self, routed: Routed, exc: UpstreamStreamError) -> None:
        """A response broke off. If the engine went away (the connection closed or reset under it),
        mark it down at once, so the next requests go elsewhere until a probe finds it again, and
        drop the session's slot lease there: a restarted engine holds nothing of it."""
        if not exc.gone:
            return
        log.warning("upstream.lost", backend=exc.backend_id, error=exc.message)
        self.fleet.report_failure(exc.backend_id, exc.message)
        if routed.session is not None and routed.decision.slot is not None:
            await self.core.store.release_slots(routed.session.key)

    def _observe(self, record: RequestRecord, duration_s: float) -> None:
        """When a request's log line is written (exactly once): its metrics."""
        self.metrics.observe(record, duration_s)

    async def _end(self, record: RequestRecord) -> None:
        """A request ended: its key's admission ends (once), then its log line is written."""
        ticket, record.ticket = record.ticket, None
        await self.access.release(ticket, record.usage)
        record.emit()

    @staticmethod
    def _headers(opened: Opened) -> dict[str, str]:
        decision = opened.decision
        headers = {
            "x-turnout-backend": decision.chosen.backend_id if decision.chosen else "",
            "x-turnout-model": decision.chosen.model if decision.chosen else "",
            "x-turnout-route-reason": decision.header,
        }
        if decision.slot is not None:
            headers["x-turnout-slot"] = str(decision.slot)
        if opened.routed.features.session_key is not None:
            headers["x-turnout-session-source"] = opened.routed.features.session_source.value
        if opened.routed.residency_wait_s is not None:
            headers["x-turnout-residency-wait"] = f"{opened.routed.residency_wait_s:.3f}"
        if opened.routed.output_capped is not None:
            asked, limit = opened.routed.output_capped
            headers["x-turnout-output-capped"] = f"{asked} -> {limit}"
        return headers

    async def _stream(self, opened: Opened, record: RequestRecord, api: str) -> AsyncIterator[bytes]:
        """Relay events; a failure after the first byte becomes the API's error event, then a clean end."""
        relay = opened.relay
        self._streams.add(relay.watchdog)
        first = True
        try:
            with relay.watchdog:  # a hung or stalled stream is ended, in this task (the response's)
                async for events in relay.events():
                    if first and relay.first_token_at is not None:
                        first = False
                        self.fleet.prefilled(opened.token)  # its prompt is processed: no backlog
                    yield events
        except (UpstreamStreamError, Expired) as exc:
            record.error = exc.message
            if self.draining and isinstance(exc, Expired):  # ours, not the engine's
                yield stream_error_event(api, ShuttingDown(f"{exc.message}: the answer was cut short"))
                return
            error = UpstreamFailed(f"backend {relay.request.backend_id} failed mid-stream: {exc.message}")
            yield stream_error_event(api, error)
            self.fleet.judge(relay.request.backend_id, exc.message)
            if isinstance(exc, UpstreamStreamError):
                await self._engine_lost(opened.routed, exc)
        finally:
            self._streams.discard(relay.watchdog)
            await relay.aclose()

    async def _finish_stream(self, opened: Opened, record: RequestRecord) -> None:
        """Runs after the stream ended or the client left: close upstream, learn, write the log line."""
        await opened.relay.aclose()
        if opened.relay.finished and record.error is None:
            self.fleet.judge(opened.relay.request.backend_id, None)
        shared = self.fleet.end(opened.token)
        if not opened.relay.finished and record.error is None:
            record.status, record.error = CLIENT_CLOSED, "client disconnected"
        await self._complete(opened, record, shared)

    async def _complete(self, opened: Opened, record: RequestRecord, shared: bool) -> None:
        """After a response: the outcome goes to learning, the session and the decision log; one log
        line. ``shared``: a warm-up's prompt processing overlapped the request's (``Fleet.end``)."""
        relay = opened.relay
        record.first_token_at, record.usage = relay.first_token_at, relay.usage
        outcome = None
        chosen = opened.decision.chosen_candidate
        inference = opened.routed.features.endpoint is not Endpoint.COUNT_TOKENS
        if relay.usage is not None and chosen is not None and record.error is None and inference:
            outcome = measured(
                opened.routed,
                self.fleet.adapter(chosen.deployment.backend_id).kind,
                relay.usage,
                ttft_s=record.ttft_s,
                duration_s=self.fleet.clock.monotonic() - record.started,
                stream=relay.request.stream,
                shared=shared,
            )
        done = Completion(opened.routed, record.request_id, record.status, record.error, outcome)
        await self.lifecycle.settle(done)
        await self._end(record)
