"""One request's life, the same for every front end: ``route`` once, ``open`` (sent, re-routed after
a failure before any byte by the shared ``gateway.retry`` step), ``settle`` once
(``gateway.completion``'s pipeline).

The HTTP relay (``gateway.relay``) wraps it in a request and a response; the virtual replay
(``gateway.replay.virtual``) drives the same route and settle on simulated engines, and re-routes
through the same retry step.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import msgspec
import structlog
from msgspec.structs import replace

from backends.base import Adapter, UpstreamRequest
from backends.errors import UpstreamError, UpstreamUnavailable
from backends.fleet import Fleet
from backends.sent import Sent
from backends.stream import ResponseRelay
from backends.watchdog import Expired
from gateway.catalog import Catalog, max_output_tokens
from gateway.completion import Completion, settle
from gateway.errors import InvalidRequest, from_upstream
from gateway.record import RequestRecord
from gateway.residency import Residency
from gateway.retry import after_failure, gave_up
from gateway.routed import Routed
from gateway.routing import Router
from gateway.warming import Warming
from policies import Decision, Endpoint, RequestFeatures
from policies.features import (
    OUTPUT_LIMIT_FIELDS,
    FeatureError,
    ModelFacts,
    output_cap,
    request_features,
    with_shape,
)
from policies.types import Reason

log = structlog.get_logger(__name__)


def in_flight(decision: Decision, now: float, features: RequestFeatures | None = None) -> Sent:
    """The fleet's note of a request (of ``features``) sent along ``decision`` at ``now``, with what
    was predicted for it."""
    chosen = decision.chosen_candidate
    assert decision.chosen is not None
    request = Sent(
        decision.chosen.backend_id,
        decision.slot,
        now,
        prompt_tokens=features.prompt_tokens if features is not None else 0,
        holds=features is None or features.endpoint is not Endpoint.COUNT_TOKENS,
        stream=features is not None and features.stream,
    )
    if chosen is None or chosen.estimate is None:
        return request
    estimate = chosen.estimate
    return replace(
        request,
        total_s=estimate.total_s,
        queue_s=estimate.queue_s,
        deferred_s=estimate.deferred_s,
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


class Lifecycle:
    """Route, open and settle requests on one fleet, catalog and router (``gateway.core`` builds it)."""

    def __init__(
        self,
        fleet: Fleet,
        catalog: Catalog,
        router: Router,
        *,
        retries: int,
        residency: Residency | None = None,
    ) -> None:
        self.fleet = fleet
        self.catalog = catalog
        self.router = router
        self.retries = retries
        self.residency = residency
        """The residency sets: a request whose backend a switch is waking waits for it (``wait``)."""
        self.warming = Warming(fleet, router)
        """The background warm-ups of llama.cpp slots the decisions ask for (``gateway.warming``)."""

    async def route(self, body: dict[str, Any], endpoint: Endpoint, headers: Mapping[str, str]) -> Routed:
        """Resolve the model (an unset output limit gets the model's), read the request's features,
        and route it (``Router.route``: session, counting near a window, the decision); with no
        candidate while a residency switch wakes one, wait for it (``wait``)."""
        model = self.catalog.resolve(body["model"])
        ceiling = max_output_tokens(model, self.catalog.window(model, self.fleet.snapshots()))
        asked = max(
            (v for f in OUTPUT_LIMIT_FIELDS.get(endpoint, ()) if isinstance(v := body.get(f), int)), default=0
        )
        capped = output_cap(body, endpoint, model.max_output_tokens, ceiling)
        body.update(capped)
        learned = self.router.learned.for_model(model.name, model.chars_per_token).chars_per_token.value
        facts = ModelFacts(model.name, learned, model.members, model.prefer_default, model.reasoning_floor_b)
        try:
            features = request_features(body, endpoint, headers, facts)
        except FeatureError as exc:
            raise InvalidRequest(str(exc), param=exc.param) from exc
        routed = await self.router.route(features, body)
        if routed.decision.chosen is None:  # a residency switch may be waking a backend for it
            routed = await self.wait(routed, frozenset())
        if asked > ceiling and capped:
            routed = replace(routed, output_capped=(asked, ceiling))
        return routed

    async def open(
        self, endpoint: Endpoint, body: dict[str, Any], routed: Routed, record: RequestRecord
    ) -> Opened:
        """Send along ``routed``; on a failure before any byte, what ``gateway.retry`` says: route again
        without that backend, or give up."""
        excluded: set[str] = set()
        last_error: UpstreamError | None = None
        try:
            for attempt in range(1, self.retries + 2):
                if excluded:
                    again = await self.router.decide(
                        routed.features, routed.session, frozenset(excluded), routed.overflowed
                    )
                    # the wait it had stays with it: its header, and no second wait
                    routed = replace(
                        again, output_capped=routed.output_capped, residency_wait_s=routed.residency_wait_s
                    )
                if routed.decision.chosen is None and routed.residency_wait_s is None:
                    routed = await self.wait(routed, frozenset(excluded))  # a re-route: one wait a request
                routed = await self.awake_choice(routed, frozenset(excluded))  # no await from here to begin
                record.residency_wait_s = routed.residency_wait_s
                decision = routed.decision
                if decision.chosen is None:
                    raise gave_up(routed, last_error)
                record.backend, record.reason = decision.chosen.backend_id, decision.header
                chosen = decision.chosen_candidate
                record.predicted_ttft = chosen.estimate.ttft_s if chosen and chosen.estimate else None
                adapter = self.fleet.adapter(decision.chosen.backend_id)
                # a group's answer names the member that gave it; a model's, the name it was asked by
                named = decision.chosen.model if routed.features.members else body["model"]
                upstream = adapter.prepare(endpoint, body, decision.chosen, named, slot=decision.slot)
                # in flight from now: a queued llama.cpp stream sends no headers until a slot takes
                # it, and requests routed meanwhile must see it waiting there
                sent = in_flight(decision, self.fleet.clock.time(), routed.features)
                token = self.fleet.begin(sent)
                try:
                    relay = await self._send(adapter, upstream)
                except UpstreamError as exc:
                    verdict = after_failure(exc, routed, attempt, self.retries)
                    if verdict.fault is not None:
                        self.fleet.judge(exc.backend_id, verdict.fault)
                    self.fleet.end(token)
                    if verdict.unreachable:  # avoid until probed again
                        self.fleet.report_failure(exc.backend_id, exc.message)
                    if verdict.retry is None:
                        raise
                    routed, last_error = verdict.retry, exc
                    excluded.add(verdict.exclude)
                    record.retries = attempt
                    log.warning("upstream.failed", backend=exc.backend_id, error=exc.message)
                    continue
                except BaseException:
                    self.fleet.end(token)
                    raise  # cancelled (the client left) or a bug: nothing to retry
                # the prompt's per-message shape (diagnostics, kept with the session) once it is on
                # its way: no decision reads it, and the engine prefills meanwhile
                routed = replace(routed, features=with_shape(routed.features, body))
                self.warming.start(endpoint, body, routed)  # the next turn's slot, meanwhile
                return Opened(routed, relay, token)
        except UpstreamError as exc:
            raise from_upstream(exc) from exc
        raise AssertionError("unreachable: the last attempt returns or raises")  # pragma: no cover

    async def wait(self, routed: Routed, excluded: frozenset[str]) -> Routed:
        """No backend could take the request, and a residency switch is waking one that could (or a
        set that wakes on demand starts one now): wait for it (at most the set's ``wait_s``) and
        route again, once; else ``routed`` as it is."""
        asleep = [r.backend_id for r in routed.decision.rejected if r.reason is Reason.ASLEEP]
        serving = [r.backend_id for r in routed.decision.rejected]  # whatever kept each from taking it
        if self.residency is None or not self.residency.can_wake(asleep, serving):
            return routed
        started = self.fleet.clock.monotonic()
        await self.residency.wait_for(asleep, serving=serving)
        waited = self.fleet.clock.monotonic() - started
        log.info("residency.waited", backends=asleep, waited_s=round(waited, 3))
        again = await self.router.decide(routed.features, routed.session, excluded, routed.overflowed)
        return replace(again, output_capped=routed.output_capped, residency_wait_s=waited)

    def fell_asleep(self, routed: Routed) -> bool:
        """Whether the chosen backend is no longer awake (a residency switch began since the decision)."""
        chosen = routed.decision.chosen
        return (
            self.residency is not None and chosen is not None and chosen.backend_id in self.residency.asleep()
        )

    async def awake_choice(self, routed: Routed, excluded: frozenset[str]) -> Routed:
        """``routed``, decided again while its backend fell asleep after the decision (a switch began
        during the decision's awaits: its drain saw nothing in flight there yet). It returns with no
        await after its last check, so the request is in flight before a drain can look again."""
        while self.fell_asleep(routed):
            assert routed.decision.chosen is not None
            excluded = excluded | {routed.decision.chosen.backend_id}
            again = await self.router.decide(routed.features, routed.session, excluded, routed.overflowed)
            routed = replace(
                again, output_capped=routed.output_capped, residency_wait_s=routed.residency_wait_s
            )
        return routed

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

    async def settle(self, done: Completion) -> Completion:
        """The request ended: its completion through the pipeline (``gateway.completion``)."""
        return await settle(self.router, done)
