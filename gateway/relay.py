"""The request path: parse, route, send (re-routing only before the first byte), relay, record.

read body -> parse -> resolve model -> extract features -> route -> adapter.prepare
  -> adapter.send (retry on another backend while nothing reached the client)
  -> stream events through / return the body -> canonical log line
"""

from __future__ import annotations

import asyncio
import math
from collections.abc import AsyncIterator, Mapping
from typing import Any

import msgspec
import structlog
from litestar import Request, Response
from litestar.background_tasks import BackgroundTask
from msgspec.structs import replace

from backends.base import Adapter, UpstreamRequest
from backends.errors import UpstreamError, UpstreamStatusError, UpstreamStreamError, UpstreamUnavailable
from backends.fleet import Fleet
from backends.inflight import Sent
from backends.stream import ResponseRelay
from backends.watchdog import Expired, Watchdog
from gateway.access import Access
from gateway.catalog import Catalog
from gateway.disconnect import ClientDisconnected, DisconnectWatch
from gateway.errors import (
    ContextLengthExceeded,
    GatewayError,
    InvalidRequest,
    ModelNotFound,
    NoBackendAvailable,
    ShuttingDown,
    UpstreamFailed,
    from_upstream,
    stream_error_event,
)
from gateway.metrics import Metrics
from gateway.record import RequestRecord
from gateway.requests import parse_body, read_body
from gateway.routing import Routed, Router, decision_entry, engine_counted
from gateway.streaming import EventStream
from gateway.timeline import turn_record
from policies import Decision, Endpoint, Reason, RequestFeatures, extract
from policies.features import OUTPUT_LIMIT_FIELDS, with_shape
from policies.types import EngineKind, Outcome, Rejection, Usage

log = structlog.get_logger(__name__)

PROMPT_PARAM = {Endpoint.COMPLETIONS: "prompt", Endpoint.RESPONSES: "input"}
SSE_HEADERS = {"cache-control": "no-cache", "x-accel-buffering": "no"}
CLIENT_CLOSED = 499  # nginx's status for "client closed request", used in logs only


def _overflowed(exc: BaseException | None) -> bool:
    """The engine refused the prompt as longer than its window: another backend may have a larger one."""
    return isinstance(exc, UpstreamStatusError) and exc.context_exceeded


def engine_fault(exc: UpstreamError) -> str | None:
    """How a failure reflects on the engine (circuit breaking): unreachable, hung, a 5xx or a stream
    that broke off or stalled are its fault; a 4xx (a bad or too long request) is not."""
    if isinstance(exc, UpstreamStatusError):
        return exc.message if exc.status >= 500 else None
    return exc.message


def _retryable(exc: BaseException) -> bool:
    return isinstance(exc, UpstreamError) and (bool(getattr(exc, "retryable", False)) or _overflowed(exc))


def _api(endpoint: Endpoint) -> str:
    if endpoint.anthropic:
        return "anthropic"
    return "responses" if endpoint is Endpoint.RESPONSES else "openai"


SIZE_FLOOR_HEADER = "x-turnout-min-params-b"


def size_floor(headers: Mapping[str, str]) -> float | None:
    """The ``x-turnout-min-params-b`` header: billions of parameters the answering model must have."""
    text = headers.get(SIZE_FLOOR_HEADER)
    if text is None:
        return None
    try:
        value = float(text)
    except ValueError:
        value = float("nan")
    if not math.isfinite(value) or value <= 0:
        raise InvalidRequest(
            f"{SIZE_FLOOR_HEADER} must be a positive number of billions of parameters, not {text[:40]!r}",
            param=SIZE_FLOOR_HEADER,
        )
    return value


REASONING_BUDGET_TOKENS = 16_000
"""An Anthropic ``thinking`` budget from which a request counts as asking for deep reasoning."""


def asks_deep_reasoning(body: Mapping[str, Any]) -> bool:
    """``reasoning_effort: "high"`` (Chat Completions), ``reasoning: {"effort": "high"}`` (Responses),
    or ``thinking: {"type": "enabled", "budget_tokens": >= REASONING_BUDGET_TOKENS}`` (Messages)."""
    if body.get("reasoning_effort") == "high":
        return True
    reasoning = body.get("reasoning")
    if isinstance(reasoning, Mapping) and reasoning.get("effort") == "high":
        return True
    thinking = body.get("thinking")
    if isinstance(thinking, Mapping) and thinking.get("type") == "enabled":
        budget = thinking.get("budget_tokens")
        return isinstance(budget, int) and budget >= REASONING_BUDGET_TOKENS
    return False


NOT_ASKED = (Reason.PINNED, Reason.KEEPS_MODEL)
"""Rejections that say which of a group's members was not asked, not why a request cannot be served."""


def refusals(decision: Decision) -> tuple[Rejection, ...]:
    """The rejections that explain a refusal: a group's members left out by an admin's pin or a
    conversation's own member do not (a prompt too long for the pinned member is still an overflow)."""
    return tuple(r for r in decision.rejected if r.reason not in NOT_ASKED) or decision.rejected


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


def cap_output(body: dict[str, Any], endpoint: Endpoint, limit: int | None) -> None:
    """A request that sets no output limit gets the model's configured ``max_output_tokens`` (Codex
    never sends one; llama.cpp would otherwise generate until the window is full)."""
    fields = OUTPUT_LIMIT_FIELDS.get(endpoint)
    if limit is not None and fields and all(body.get(f) is None for f in fields):
        body[fields[0]] = limit


def in_flight(decision: Decision, now: float) -> Sent:
    """The fleet's note of a request sent along ``decision`` at ``now``, with what was predicted for it."""
    chosen = decision.chosen_candidate
    assert decision.chosen is not None
    request = Sent(decision.chosen.backend_id, decision.slot, now)
    if chosen is None or chosen.estimate is None:
        return request
    estimate = chosen.estimate
    return replace(
        request,
        total_s=estimate.total_s,
        queue_s=estimate.queue_s,
        prefill_s=estimate.prefill_s,
        interleaved_s=estimate.interleaved_s,
    )


class Opened(msgspec.Struct, frozen=True):
    routed: Routed
    relay: ResponseRelay
    token: int  # the fleet's note of this in-flight request

    @property
    def decision(self) -> Decision:
        return self.routed.decision


class Relay:
    """Everything one request needs, built once at start-up and shared by all requests."""

    def __init__(
        self,
        fleet: Fleet,
        catalog: Catalog,
        router: Router,
        *,
        retries: int,
        max_body: int,
        body_timeout_s: float = 30.0,
        metrics: Metrics | None = None,
        access: Access | None = None,
    ) -> None:
        self.metrics = metrics or Metrics()
        self.access = access or Access(())
        self.fleet = fleet
        self.catalog = catalog
        self.router = router
        self.retries = retries
        self.max_body = max_body
        self.body_timeout_s = body_timeout_s
        self.draining = False
        """Shutting down: new requests get 503 (``drain``)."""
        self._streams: set[Watchdog] = set()  # the streams being relayed, to end at the grace's end

    async def open(
        self, endpoint: Endpoint, body: dict[str, Any], routed: Routed, record: RequestRecord
    ) -> Opened:
        """Send along ``routed``; on a failure before any byte, exclude that backend and route again."""
        excluded: set[str] = set()
        last_error: UpstreamError | None = None
        try:
            for attempt in range(1, self.retries + 2):
                if excluded:
                    routed = await self.router.decide(
                        routed.features, routed.session, frozenset(excluded), routed.overflowed
                    )
                decision = routed.decision
                if decision.chosen is None:
                    if isinstance(last_error, UpstreamStatusError) and _overflowed(last_error):
                        raise no_route_error(decision, routed.features, last_error)
                    if last_error is not None:
                        raise last_error
                    raise no_route_error(decision, routed.features)
                record.backend, record.reason = decision.chosen.backend_id, decision.header
                chosen = decision.chosen_candidate
                record.predicted_ttft = chosen.estimate.ttft_s if chosen and chosen.estimate else None
                adapter = self.fleet.adapter(decision.chosen.backend_id)
                # a group's answer names the member that gave it; a model's, the name it was asked by
                named = decision.chosen.model if routed.features.members else body["model"]
                upstream = adapter.prepare(endpoint, body, decision.chosen, named, slot=decision.slot)
                # in flight from now: a queued llama.cpp stream sends no headers until a slot takes
                # it, and requests routed meanwhile must see it waiting there
                token = self.fleet.begin(in_flight(decision, self.fleet.clock.time()))
                try:
                    relay = await self._send(adapter, upstream)
                except BaseException as exc:
                    if isinstance(exc, UpstreamError) and (fault := engine_fault(exc)) is not None:
                        self.fleet.judge(exc.backend_id, fault)
                    self.fleet.end(token)
                    if not isinstance(exc, UpstreamError):
                        raise  # cancelled (the client left) or a bug: nothing to retry
                    if isinstance(exc, UpstreamStatusError) and exc.context_exceeded:
                        routed = engine_counted(routed, exc)
                    if isinstance(exc, UpstreamUnavailable):  # unreachable: avoid until probed again
                        self.fleet.report_failure(exc.backend_id, exc.message)
                    if not _retryable(exc) or attempt > self.retries:
                        raise
                    excluded.add(exc.backend_id)
                    last_error = exc
                    record.retries = attempt
                    log.warning("upstream.failed", backend=exc.backend_id, error=exc.message)
                    continue
                # the prompt's per-message shape (diagnostics, kept with the session) once it is on
                # its way: no decision reads it, and the engine prefills meanwhile
                routed = replace(routed, features=with_shape(routed.features, body))
                return Opened(routed, relay, token)
        except UpstreamError as exc:
            raise from_upstream(exc) from exc
        raise AssertionError("unreachable: the last attempt returns or raises")  # pragma: no cover

    async def _send(self, adapter: Adapter, upstream: UpstreamRequest) -> ResponseRelay:
        """Send, under the engine's watchdog (``backends.watchdog``: queued is waited for, hung is
        not); until the engine's headers nothing has reached the client, so every failure here may
        still go to another backend."""
        dog = self.fleet.watchdog(upstream.backend_id)
        try:
            with dog:
                relay = ResponseRelay(
                    upstream, await adapter.send(upstream), self.fleet.clock.monotonic, watchdog=dog
                )
        except Expired as exc:
            raise UpstreamUnavailable(upstream.backend_id, exc.message) from exc
        if upstream.stream:
            try:
                relay.check_stream()
            except UpstreamUnavailable:
                await relay.aclose()
                raise
        return relay

    async def route(self, body: dict[str, Any], endpoint: Endpoint, headers: Mapping[str, str]) -> Routed:
        """Resolve the model and the session, then decide."""
        model = self.catalog.resolve(body["model"])
        cap_output(body, endpoint, model.max_output_tokens)
        chars_per_token = self.router.learned.for_model(
            model.name, model.chars_per_token
        ).chars_per_token.value
        features = extract(
            body, endpoint, model=model.name, headers=headers, chars_per_token=chars_per_token, shape=False
        )
        if model.members:
            features = replace(features, members=model.members, prefer_default=model.prefer_default)
        floor = size_floor(headers)
        if model.reasoning_floor_b is not None and asks_deep_reasoning(body):
            floor = max(floor or 0.0, model.reasoning_floor_b)
        if floor is not None:
            features = replace(features, min_params_b=floor)
        if endpoint is Endpoint.COUNT_TOKENS:  # no inference: no session, no slot, nothing to learn
            return await self.router.decide(features, None)
        features, session = await self.router.resolve_session(features)
        features = await self.router.count_if_near_limit(features, body, session)
        routed = await self.router.decide(features, session)
        rejected = refusals(routed.decision)
        too_long = bool(rejected) and all(r.reason is Reason.CONTEXT_TOO_LONG for r in rejected)
        if routed.decision.chosen is None and too_long and not features.prompt_exact:
            # refuse on the engine's count, not on an estimate
            features = await self.router.count_if_near_limit(features, body, session, always=True)
            routed = await self.router.decide(features, session)
        return routed

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
            record.ticket = await self.access.admit(key, self.catalog.resolve(body["model"]).name)
            record.stream = bool(body.get("stream"))
            routed = await self.route(body, endpoint, request.headers)
            record.model = routed.features.model
            watch = DisconnectWatch(request.receive)
            opened = await watch.run(self.open(endpoint, body, routed, record))
            headers = self._headers(opened)
            if opened.relay.request.stream:
                await watch.stop()
                return EventStream(
                    self._stream(opened, record, _api(endpoint)),
                    media_type="text/event-stream",
                    headers={**SSE_HEADERS, **headers},
                    background=BackgroundTask(self._finish_stream, opened, record),
                )
            try:
                content = await watch.run(opened.relay.body())
                self.fleet.judge(opened.relay.request.backend_id, None)
            except UpstreamStreamError as exc:
                self.fleet.judge(exc.backend_id, exc.message)
                raise
            finally:
                await opened.relay.aclose()
                self.fleet.end(opened.token)
            await self._complete(opened, record)
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
                entry = decision_entry(
                    routed,
                    record.request_id,
                    None,
                    exc.status,
                    exc.message,
                    at=self.fleet.clock.time(),
                    redact=self.router.redact_session_ids,
                )
                await self.router.store.record_decision(entry)
            raise
        finally:
            if watch is not None:
                await watch.stop()

    async def drain(self, grace_s: float, poll_s: float = 0.1) -> None:
        """Shut down gently: refuse new requests (503), let those in flight finish for ``grace_s``,
        then end the streams still running with their API's error event."""
        self.draining = True
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
            await self.router.store.release_slots(routed.session.key)

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
        return headers

    async def _stream(self, opened: Opened, record: RequestRecord, api: str) -> AsyncIterator[bytes]:
        """Relay events; a failure after the first byte becomes the API's error event, then a clean end."""
        relay = opened.relay
        self._streams.add(relay.watchdog)
        first = True
        try:
            with relay.watchdog:  # a hung or stalled stream is ended, in this task (the response's)
                async for events in relay.events():
                    if first:
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
        self.fleet.end(opened.token)
        if not opened.relay.finished and record.error is None:
            record.status, record.error = CLIENT_CLOSED, "client disconnected"
        await self._complete(opened, record)

    async def _complete(self, opened: Opened, record: RequestRecord) -> None:
        """After a response: the outcome goes to learning, the session and the decision log; one log line."""
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
            )
        await settle(self.router, opened.routed, record.request_id, outcome, record.status, record.error)
        await self._end(record)


def measured(
    routed: Routed, kind: EngineKind, usage: Usage, *, ttft_s: float | None, duration_s: float, stream: bool
) -> Outcome:
    """What a request routed along ``routed`` really did, for learning (its chosen candidate's
    prediction beside it)."""
    chosen = routed.decision.chosen_candidate
    assert chosen is not None
    estimate = chosen.estimate
    return Outcome(
        backend_id=chosen.deployment.backend_id,
        model=chosen.deployment.model,
        kind=kind,
        usage=usage,
        ttft_s=ttft_s,
        duration_s=duration_s,
        prompt_chars=routed.features.prompt_chars,
        shared_prefix_tokens=estimate.shared_prefix_tokens if estimate else 0,
        stream=stream,
        contended=estimate.contended if estimate else False,
        predicted=estimate,
    )


async def settle(
    router: Router, routed: Routed, request_id: str, outcome: Outcome | None, status: int, error: str | None
) -> None:
    """A routed request ended: its decision log entry, and with an ``outcome``, learning and the
    session's next state and timeline (``Router.complete``), stamped on the router's clock."""
    now = router.clock.time()
    entry = decision_entry(
        routed, request_id, outcome, status, error, at=now, redact=router.redact_session_ids
    )
    chosen = routed.decision.chosen_candidate
    if outcome is None or chosen is None:
        await router.store.record_decision(entry)
        return
    if router.recorder is not None and status < 400:
        router.recorder.record(routed.features, outcome, entry["session"], at=now)
    turn = None
    if routed.session is not None:
        rate = router.learned.for_deployment(chosen.deployment, outcome.kind).prefill_tok_s.value
        turn = turn_record(routed, outcome, request_id, rate, at=now)
    await router.complete(routed, outcome, entry, turn)
