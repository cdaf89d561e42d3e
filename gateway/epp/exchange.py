"""One request through Envoy, as the Endpoint Picker sees it: one ext_proc stream.

The request is routed by the same lifecycle as ``turnout serve``'s (``Lifecycle.route``: the model,
the request's features, the session, the decision), on the same core: router, policies, sessions,
slot leases, model groups and state store. What changes is who carries the bytes:

1. request headers and body: read whole (Envoy holds the request meanwhile); then the decision,
   narrowed to the data plane's subset hint when it sends one. The engine's request is the one the
   relay would send (``Adapter.prepare``: the model's upstream name, the llama.cpp slot, the usage
   chunk), so the picker answers the headers with the destination, the upstream path and its auth,
   and streams that body back (``wire``); in Envoy's BUFFERED mode, one answer to the whole body
   carries both. The request is in flight on the fleet from then on.
2. response headers: a 2xx answer is read by the relay's own reader (``gateway.epp.answer``), so
   learning goes on while Envoy carries the bytes; any other status passes through untouched, and
   5xx counts against the engine.
3. the end: the completion settles through the same pipeline (``Lifecycle.settle``: learning, the
   session, the decision log) before the body's last chunk goes back; a stream Envoy closes early
   (the client left, the engine died) settles as cut short, once.

Errors before an engine is chosen answer the client at once in its API's error JSON with the
relay's status (400, 401, 404, 413, 429 over a key's limit, 503 when no endpoint fits).
"""

from __future__ import annotations

import asyncio
import uuid
from typing import Any
from urllib.parse import parse_qsl, urlsplit

import msgspec
import structlog
from msgspec.structs import replace

from backends.base import UPSTREAM_PATHS, Adapter, UpstreamRequest
from gateway.completion import Completion, measured
from gateway.core import Core
from gateway.epp import wire
from gateway.epp.answer import Answer, EnvoyResponse, Write
from gateway.epp.fallbacks import fallbacks
from gateway.epp.wire import endpoint_address
from gateway.errors import (
    GatewayError,
    ModelNotFound,
    NoBackendAvailable,
    PayloadTooLarge,
    UpstreamFailed,
    stream_api,
)
from gateway.lifecycle import in_flight
from gateway.metrics import CLIENT_CLOSED
from gateway.model_api import anthropic_listing, openai_listing, speaks_anthropic
from gateway.record import RequestRecord
from gateway.requests import parse_body
from gateway.retry import gave_up
from gateway.routed import Routed
from policies import Endpoint, Health

log = structlog.get_logger(__name__)

ENDPOINTS = {path: endpoint for endpoint, path in UPSTREAM_PATHS.items()}
"""The client paths the picker routes (the engines' own: Envoy forwards the path as sent)."""


class Exchange:
    """One ext_proc stream (module docstring). ``handle`` each message Envoy sends, then ``close``."""

    def __init__(self, core: Core, write: Write, *, max_body: int, fallbacks: int = 0) -> None:
        self.core, self.write, self.max_body, self.fallbacks = core, write, max_body, fallbacks
        self.named: dict[str, str] = {}  # the endpoints named for the request (ip:port -> backend id)
        self.served_by: str | None = None  # the fallback that answered, if the primary did not
        clock = core.fleet.clock.monotonic
        self.record = RequestRecord("", clock(), observer=core.metrics.observe, clock=clock)
        self.headers: dict[str, str] = {}
        self.body = bytearray()
        self.subset: frozenset[str] | None = None
        self.endpoint: Endpoint | None = None
        self.routed: Routed | None = None
        self.upstream: UpstreamRequest | None = None
        self.token: int | None = None  # the fleet's note of the request in flight
        self.answer: Answer | None = None  # a 2xx answer, on its way back
        self.pump: asyncio.Task[None] | None = None  # ``Answer.run``
        self.settled = False
        self.request_mode = self.response_mode = wire.STREAMED_MODE  # what Envoy says, else the protocol's

    # --- the request ------------------------------------------------------------------------------

    async def handle(self, message: Any) -> None:
        phase = message.WhichOneof("request")
        if message.HasField("protocol_config"):  # the first message says how the bodies will come
            self.request_mode = message.protocol_config.request_body_mode
            self.response_mode = message.protocol_config.response_body_mode
        if phase == "request_headers":
            self.headers = wire.header_map(message.request_headers)
            # Envoy's request id (it makes one when the client sent none): the picker's log lines
            # and decision log entries carry the id Envoy's access log does
            self.record.request_id = self.headers.get("x-request-id") or uuid.uuid4().hex
            self.subset = wire.subset_hint(message)
            if message.request_headers.end_of_stream:
                await self._answer_bodiless()
            elif self.request_mode == wire.BUFFERED_MODE:  # Envoy waits for this before the body
                await self.write(wire.go_on("request_headers"))
        elif phase == "request_body":
            self.body += message.request_body.body
            if len(self.body) > self.max_body:
                await self._refuse(
                    PayloadTooLarge(f"Request body exceeds the limit of {self.max_body} bytes.")
                )
            elif message.request_body.end_of_stream:
                await self._route()
        elif phase in ("request_trailers", "response_trailers"):
            await self.write(wire.trailers(phase))
        elif phase == "response_headers":
            await self._response_headers(message)
        elif phase == "response_body":
            await self._response_body(message.response_body.body, message.response_body.end_of_stream)

    @property
    def path(self) -> str:
        return urlsplit(self.headers.get(":path", "/")).path

    @property
    def anthropic(self) -> bool:
        return self.endpoint.anthropic if self.endpoint is not None else speaks_anthropic(self.headers)

    async def _answer_bodiless(self) -> None:
        """A request without a body: the model list and the health are the picker's own answers
        (``/health`` as ``turnout serve`` gives it: 200 while an engine is ready or not yet probed);
        nothing else is routed."""
        path = self.path
        self.record.endpoint = "models"
        if path == "/health":
            snapshots = self.core.fleet.snapshots()
            ok = any(s.health.value in ("ready", "unknown") and not s.circuit_blocks for s in snapshots)
            health = {
                "status": "ok" if ok else "unavailable",
                "backends": {s.backend_id: s.health.value for s in snapshots},
            }
            await self.write(wire.immediate(200 if ok else 503, msgspec.json.encode(health), self._id()))
            return
        try:
            if path != "/v1/models":
                raise ModelNotFound(
                    f"turnout epp routes POST {', '.join(ENDPOINTS)} and answers GET /v1/models and "
                    f"/health; not {self.headers.get(':method', 'GET')} {path}"
                )
            core = self.core
            key = core.access.authenticate(self.headers)
            catalog = core.catalog.visible(lambda name: core.access.allows(key, name))
            query = dict(parse_qsl(urlsplit(self.headers.get(":path", "")).query))
            listing = anthropic_listing if speaks_anthropic(self.headers) else openai_listing
            body = msgspec.json.encode(listing(catalog, core.fleet.snapshots(), query))
        except GatewayError as exc:
            await self._refuse(exc)
            return
        await self.write(wire.immediate(200, body, self._id()))
        self.record.emit()

    def _id(self) -> dict[str, str]:
        """The answer's ``x-request-id``, as ``turnout serve`` sets it: the client's, or Envoy's."""
        return {"x-request-id": self.record.request_id}

    async def _route(self) -> None:
        core, record = self.core, self.record
        try:
            endpoint = ENDPOINTS.get(self.path)
            if endpoint is None or self.headers.get(":method", "POST") != "POST":
                raise ModelNotFound(f"turnout epp routes POST {', '.join(ENDPOINTS)}; not {self.path}")
            self.endpoint, record.endpoint = endpoint, endpoint.value
            key = core.access.authenticate(self.headers)
            record.key = key.name if key else None
            body = parse_body(bytes(self.body), endpoint)
            record.ticket = await core.access.admit(key, core.catalog.resolve(body["model"]).name)
            record.stream = bool(body.get("stream"))
            routed = await core.lifecycle.route(body, endpoint, self.headers)
            self.routed, record.model = routed, routed.features.model
            routed = self.routed = await self._within_subset(routed)
            while core.lifecycle.fell_asleep(routed):  # a switch began meanwhile: never send it there
                routed = await core.lifecycle.awake_choice(routed, frozenset())
                routed = self.routed = await self._within_subset(routed)
            record.residency_wait_s = routed.residency_wait_s
            decision = routed.decision
            if decision.chosen is None:
                refusal = gave_up(routed, None)
                assert isinstance(refusal, GatewayError)  # no engine failed: the decision's own refusal
                raise refusal
            chosen = decision.chosen
            record.backend, record.reason = chosen.backend_id, decision.header
            candidate = decision.chosen_candidate
            record.predicted_ttft = candidate.estimate.ttft_s if candidate and candidate.estimate else None
            adapter = core.fleet.adapter(chosen.backend_id)
            named = chosen.model if routed.features.members else body["model"]
            self.upstream = upstream = adapter.prepare(endpoint, body, chosen, named, slot=decision.slot)
        except GatewayError as exc:
            await self._refuse(exc)
            return
        sent = in_flight(decision, core.fleet.clock.time(), routed.features)
        seen = sent.stream and self.response_mode != wire.BUFFERED_MODE  # a buffered body comes whole
        self.token = core.fleet.begin(replace(sent, stream=seen))
        core.lifecycle.warming.start(endpoint, body, routed)  # turnout's own: the next turn's slot
        url = urlsplit(upstream.url)
        headers = {":path": url.path + (f"?{url.query}" if url.query else ""), **dict(upstream.headers)}
        endpoints = self._endpoints(chosen.backend_id, headers)
        if self.request_mode == wire.BUFFERED_MODE:
            await self.write(wire.route_buffered(endpoints, headers, upstream.body))
            return
        await self.write(wire.route(endpoints, headers, ("content-length",)))
        for reply in wire.body("request_body", upstream.body, True):
            await self.write(reply)

    def _endpoints(self, backend: str, headers: dict[str, str]) -> list[str]:
        """The primary's ``ip:port``, then its fallbacks' (``gateway.epp.fallbacks``) with the retries
        Envoy may spend on them (``x-envoy-max-retries``: never more, so a retry never lands on an
        engine the picker did not name)."""
        assert self.routed is not None
        fleet = self.core.fleet
        backends = [backend]
        if self.fallbacks:
            backends += fallbacks(
                self.routed.decision, fleet.adapter, fleet.snapshots(), self._allowed, self.fallbacks
            )
            headers[wire.MAX_RETRIES] = str(len(backends) - 1)
        self.named = {endpoint_address(fleet.adapter(b).spec.base_url): b for b in backends}
        return list(self.named)

    def _allowed(self, adapter: Adapter) -> bool:
        return self.subset is None or wire.allowed(endpoint_address(adapter.spec.base_url), self.subset)

    async def _within_subset(self, routed: Routed) -> Routed:
        """The decision again without the backends outside the data plane's subset hint, if it sent one."""
        if self.subset is None:
            return routed
        fleet = self.core.fleet
        outside = frozenset(
            spec.id
            for spec in (fleet.adapter(s.backend_id).spec for s in fleet.snapshots())
            if not wire.allowed(endpoint_address(spec.base_url), self.subset)
        )
        if not outside:
            return routed
        if len(outside) == len(fleet.snapshots()):
            raise NoBackendAvailable("no endpoint of the data plane's subset hint serves this request")
        return await self.core.router.decide(routed.features, routed.session, outside, routed.overflowed)

    async def _refuse(self, error: GatewayError) -> None:
        """Answer the client now with ``error`` in its API's shape; a routed request settles too."""
        record = self.record
        record.status, record.error = error.status, error.message
        content = error.anthropic_body() if self.anthropic else error.openai_body()
        await self.write(wire.immediate(error.status, content, {**error.headers, **self._id()}))
        if self.routed is not None:
            await self._settle(error.status, error.message)
        else:
            await self._end()

    # --- the response -----------------------------------------------------------------------------

    async def _response_headers(self, message: Any) -> None:
        headers = wire.header_map(message.response_headers)
        status = int(headers.get(":status", "0") or 0)
        routed, upstream, record = self.routed, self.upstream, self.record
        record.status = status
        if routed is None or upstream is None:  # nothing was routed (an immediate answer went)
            await self.write(wire.response_headers({}))
            return
        decision = routed.decision
        added = {
            "x-turnout-backend": upstream.backend_id,
            "x-turnout-route-reason": decision.header,
            **self._id(),
        }
        if decision.slot is not None:
            added["x-turnout-slot"] = str(decision.slot)
        served = wire.served(message)
        picked = endpoint_address(self.core.fleet.adapter(upstream.backend_id).spec.base_url)
        foreign = False
        if served is not None and served != picked:  # a data plane's fallback: not what was predicted
            log.warning("epp.served_elsewhere", picked=picked, served=served)
            if self.token is not None:  # the primary holds its prompt no longer: no word on its others
                self.core.fleet.prefilled(self.token, seen=False)
            self.served_by = self.named.get(served)
            if self.served_by is not None:  # one the picker named: the primary failed before answering
                self.core.fleet.judge(upstream.backend_id, f"the data plane fell back to {self.served_by}")
                added["x-turnout-backend"] = record.backend = self.served_by
                added["x-turnout-fallback-from"] = upstream.backend_id
            foreign = self.served_by is None  # not one the picker named: its answer passes untouched
        answered_by = self.served_by or upstream.backend_id  # the engine whose answer this is
        if not 200 <= status < 300 or foreign:
            if status >= 500 and not foreign:  # a foreign engine is none of the fleet's to judge
                self.core.fleet.judge(answered_by, f"answered {status} through the data plane")
                record.error = f"backend {answered_by} answered {status}"
            await self.write(wire.response_headers(added))  # its body goes back untouched
            return
        answer = self.answer = Answer(
            upstream, EnvoyResponse(status, headers), self.core.fleet, self.write,
            buffered=self.response_mode == wire.BUFFERED_MODE, api=stream_api(routed.features.endpoint),
            anthropic=self.anthropic, answered_by=answered_by,
        )  # fmt: skip
        self.pump = asyncio.create_task(answer.run(self._answered, self._prefilled))
        await self.write(wire.response_headers(added, ("content-length",)))

    async def _response_body(self, chunk: bytes, end: bool) -> None:
        if self.answer is not None:
            self.answer.feed(chunk, end)
            if end:
                assert self.pump is not None
                await self.pump  # it sends the body's last reply
            return
        if end and self.routed is not None:  # a non-2xx answer: settle before its last bytes go back
            await self._settle(self.record.status, self.record.error or f"answered {self.record.status}")
        if self.response_mode == wire.BUFFERED_MODE:
            await self.write(wire.go_on("response_body"))
            return
        for reply in wire.body("response_body", chunk, end):
            await self.write(reply)

    async def _answered(self, error: str | None, status: int | None) -> None:
        if error is not None:
            self.record.error = error
        await self._settle(status or self.record.status, self.record.error)

    def _prefilled(self) -> None:
        if self.token is not None and self.served_by is None:  # another engine's token says nothing here
            self.core.fleet.prefilled(self.token)

    # --- the end ----------------------------------------------------------------------------------

    async def _settle(self, status: int, error: str | None) -> None:
        """The request ended (once): off the fleet, through the completion pipeline, its log line."""
        if self.settled or self.routed is None:
            return
        self.settled = True
        core, record, routed = self.core, self.record, self.routed
        relay = self.answer.relay if self.answer is not None else None
        shared = False
        if self.token is not None:
            shared = core.fleet.end(self.token)
            self.token = None
        record.status, record.error = status, error
        outcome = None
        chosen = routed.decision.chosen_candidate
        if relay is not None:
            record.first_token_at, record.usage = relay.first_token_at, relay.usage
            inference = routed.features.endpoint is not Endpoint.COUNT_TOKENS
            # a fallback's answer teaches nothing of the primary the prediction was for
            learn = inference and error is None and self.served_by is None
            if relay.usage is not None and chosen is not None and learn:
                outcome = measured(
                    routed,
                    core.fleet.adapter(chosen.deployment.backend_id).kind,
                    relay.usage,
                    ttft_s=record.ttft_s,
                    duration_s=core.fleet.clock.monotonic() - record.started,
                    stream=relay.request.stream,
                    shared=shared,
                )
        await core.lifecycle.settle(Completion(routed, record.request_id, status, error, outcome))
        await self._end()

    async def _end(self) -> None:
        ticket, self.record.ticket = self.record.ticket, None
        await self.core.access.release(ticket, self.record.usage)
        self.record.emit()

    async def close(self) -> None:
        """Envoy closed the stream: a request not answered to its end was cut short. Envoy does not
        say by whom, so an answer cut after the engine's headers has its engine probed at once: one
        that is gone is marked down (the next requests go elsewhere, its session's slot leases are
        dropped: a restarted engine holds nothing of them), else the client left. It settles once,
        shielded: gRPC cancels the stream's task, and may again (a server stopping) while it settles."""
        if self.pump is not None and not self.pump.done():
            self.pump.cancel()
        if self.routed is not None and not self.settled:
            if self.token is not None:  # off the fleet at once, whatever happens to the rest
                self.core.fleet.end(self.token)
                self.token = None
            await asyncio.shield(self._cut_short())
        elif not self.record.emitted and self.record.endpoint:
            await asyncio.shield(self._end())

    async def _cut_short(self) -> None:
        status, error = CLIENT_CLOSED, self.record.error or "the client left before the answer's end"
        if self.answer is not None and self.upstream is not None and await self._engine_gone():
            status, error = UpstreamFailed.status, f"backend {self.upstream.backend_id} went away mid-answer"
        await self._settle(status, error)

    async def _engine_gone(self) -> bool:
        assert self.upstream is not None
        fleet, backend = self.core.fleet, self.upstream.backend_id
        snapshot = await fleet.adapter(backend).probe()
        fleet.observe(snapshot)
        if snapshot.health is not Health.DOWN:
            return False
        log.warning("upstream.lost", backend=backend, error=snapshot.error)
        fleet.judge(backend, snapshot.error or "went away mid-answer")
        routed = self.routed
        if routed is not None and routed.session is not None and routed.decision.slot is not None:
            await self.core.store.release_slots(routed.session.key)
        return True
