"""Replay in virtual time: the trace's clients, the real router and the engine models on one
discrete-event loop (``backends.clock.Events``), with no HTTP, no threads and no wall clock.

What runs is the gateway's own core (``gateway.core.build_core``) and request lifecycle minus its
sockets: ``Lifecycle.route`` (the catalog, the prompt's features, the session, counting near a
window, ``Router.decide`` with its policies, learning, prefix index, slot leases and the in-memory
state store), the fleet's in-flight overlay (``Fleet.begin`` / ``prefilled`` / ``end``), the relay's
retry step after a refusal (``gateway.retry.after_failure``), and ``Lifecycle.settle`` (the completion
pipeline: learning, the session's next state, the decision log). The engines are the simulators'
engine models under the event driver (``backends.sim.drive.EventDriver``). What the gateway
observes arrives as it would:

- **probes** every ``probe_interval_s`` of each backend, through the adapters' own probe code and
  parsers, answered in process from the simulators' renderers (``backends.sim.inprocess``); stale in
  between, with the in-flight overlay on top;
- the **first token** of each request at its simulated time (``Fleet.prefilled``), and its **usage**
  (llama.cpp ``timings`` included) parsed off the task's last event when it ends;
- the gateway's **own time** per request, ``overhead_s``: a request reaches its engine that long
  after it was sent.

Pacing, the engines and the results are the world's (``virtual_world.World``). Everything is a
function of the trace and the options: the same inputs give the same results, byte for byte.
"""

from __future__ import annotations

from collections.abc import Coroutine, Mapping, Sequence
from functools import partial
from typing import Any, TypeVar

import httpx

from backends.base import Documents
from backends.errors import UpstreamStatusError
from backends.sim import SimConfig
from backends.sim.generation import Answer
from backends.sim.inprocess import EngineDocuments, final_usage
from backends.sim.task import SimTask, Update, UpdateKind
from gateway.completion import Completion, measured
from gateway.core import build_core, one_replica
from gateway.errors import GatewayError
from gateway.lifecycle import in_flight
from gateway.replay.results import request_body, request_headers
from gateway.replay.traces import TraceRequest
from gateway.replay.virtual_world import (
    ANSWER_TOKEN,
    DEFAULT_OPTIONS,
    Flight,
    VirtualOptions,
    World,
)
from gateway.retry import after_failure, gave_up
from gateway.routed import Routed
from gateway.settings import Settings
from gateway.warming import learn_from, warm_sent, warmed
from policies import Endpoint
from policies.decision import WarmUp
from policies.types import Usage

T = TypeVar("T")


def run_now(coroutine: Coroutine[Any, Any, T]) -> T:
    """Run a coroutine that never waits (the router on the in-memory store, the adapters on in-process
    documents) to its end, here and now."""
    try:
        coroutine.send(None)
    except StopIteration as stop:
        return stop.value  # type: ignore[no-any-return]
    coroutine.close()
    raise RuntimeError("a coroutine of the virtual replay waited for I/O: nothing here may")


class NoHttp(httpx.AsyncBaseTransport):
    """The fleet's HTTP client in a virtual replay: every request is a bug."""

    async def handle_async_request(self, request: httpx.Request) -> httpx.Response:
        raise RuntimeError(f"the virtual replay sent HTTP: {request.method} {request.url}")


class GatewayReplay(World):
    """A replay through turnout's request path with ``settings`` (its routing profile, its backends:
    one engine model of ``configs`` per backend id), minus the sockets (module docstring)."""

    def __init__(
        self,
        requests: Sequence[TraceRequest],
        settings: Settings,
        configs: Mapping[str, SimConfig],
        options: VirtualOptions = DEFAULT_OPTIONS,
    ) -> None:
        super().__init__(requests, {b.id: configs[b.id] for b in settings.backends}, options)
        self._in_hand: tuple[list[Any], int] | None = None  # its messages, the engine's count of them
        documents: dict[str, Documents] = {
            name: EngineDocuments(engine, self._count) for name, engine in self.engines.items()
        }
        client = httpx.AsyncClient(transport=NoHttp())
        self.core = build_core(
            one_replica(settings), self.clock, client=client, documents=documents, record=False
        )
        self.fleet, self.router, self.lifecycle = self.core.fleet, self.core.router, self.core.lifecycle

    def begin(self) -> None:
        for name in self.engines:
            self._probe(name)

    def _probe(self, backend: str) -> None:
        """Probe now, and again after the backend's interval while requests remain."""
        adapter = self.fleet.adapter(backend)
        self.fleet.observe(run_now(adapter.probe()))
        if self.pending:
            self.events.after(adapter.spec.probe_interval_s, partial(self._probe, backend))

    def _count(self, body: Any) -> int | None:
        """The engine's count of the prompt of the request in hand (None for any other body)."""
        messages = body.get("messages") if isinstance(body, dict) else None
        if self._in_hand is not None and messages == self._in_hand[0]:
            return self._in_hand[1]
        return None

    def send(self, index: int, request: TraceRequest, task: SimTask) -> None:
        body = request_body(request, self.options.block_tokens, answer_cap=self.options.answer_cap)
        self._in_hand = (body["messages"], len(task.prompt)) if request.messages is None else None
        try:
            routed = run_now(self.lifecycle.route(body, Endpoint.CHAT, request_headers(request)))
        except GatewayError as exc:
            self.fail(index, self.clock.now, exc.message)
            return
        finally:
            self._in_hand = None
        self._route(Flight(index, self.clock.now, "", task, routed=routed))

    def _route(self, flight: Flight, last: UpstreamStatusError | None = None) -> None:
        """Send along the flight's decision, noting it in flight on the fleet (``Lifecycle.open``);
        with no backend left, the error the relay gives up with (``last``: the engine's refusal)."""
        assert flight.routed is not None
        decision = flight.routed.decision
        if decision.chosen is None:
            self.fail(flight.index, flight.sent, gave_up(flight.routed, last).message)
            return
        flight.backend = decision.chosen.backend_id
        flight.first_at = None
        sent = in_flight(decision, self.clock.time(), flight.routed.features)
        flight.token = self.fleet.begin(sent)
        self.dispatch(flight, decision.slot)
        if flight.routed.warm is not None:
            self._warm_up(flight, flight.routed.warm)

    def _warm_up(self, flight: Flight, warm: WarmUp) -> None:
        """The decision's background warm-up (``gateway.warming``): the same prompt, one token, to the
        llama.cpp slot it names; in flight on the fleet, and in the prefix index once done."""
        assert flight.routed is not None
        routed, engine = flight.routed, self.engines[warm.backend_id]
        turn = flight.task
        task = SimTask(
            f"{turn.id}.warm",
            turn.prompt,
            Answer((ANSWER_TOKEN,), "length", None),
            user_start=turn.user_start,
            first_user=turn.first_user,
        )
        task.id_slot = warm.slot
        token = self.fleet.begin(warm_sent(warm, routed, self.clock.time()))

        task.listener = partial(self._warmed, token, warm, routed, task)
        sent = warmed(warm, routed)
        if sent is not None:
            run_now(self.router.store.record_prompt(sent))
        engine.n_tasks += 1
        self.events.after(self.options.overhead_s + warm.delay_s, partial(engine.submit, task))

    def _warmed(self, token: int, warm: WarmUp, routed: Routed, task: SimTask, update: Update) -> None:
        if update.kind is UpdateKind.ERROR:
            self.fleet.end(token)
        elif update.kind is UpdateKind.DONE:
            shared = self.fleet.end(token)
            usage = final_usage(self.engines[warm.backend_id], task)
            learn_from(self.router, warm, routed, usage, shared=shared)

    def first_token(self, flight: Flight) -> None:
        self.fleet.prefilled(flight.token)

    def refused(self, flight: Flight, error: UpstreamStatusError) -> None:
        """As the relay does (``gateway.retry``): a prompt too long for the engine goes to another
        backend, on the engine's own count, within the retries; anything else fails."""
        assert flight.routed is not None
        verdict = after_failure(error, flight.routed, len(flight.excluded) + 1, self.lifecycle.retries)
        if verdict.fault is not None:
            self.fleet.judge(flight.backend, verdict.fault)
        self.fleet.end(flight.token)
        if verdict.retry is None:
            self.fail(flight.index, flight.sent, error.message)
            return
        flight.excluded = flight.excluded | {verdict.exclude}
        routed = verdict.retry
        flight.routed = run_now(
            self.router.decide(routed.features, routed.session, flight.excluded, routed.overflowed)
        )
        self._route(flight, error)

    def done(self, flight: Flight, usage: Usage | None) -> None:
        """The relay's ending: the engine answered, the request leaves the fleet's overlay, and its
        outcome goes to learning, the session and the decision log."""
        assert flight.routed is not None
        self.fleet.judge(flight.backend, None)
        shared = self.fleet.end(flight.token)
        outcome = None
        if usage is not None:
            kind = self.fleet.adapter(flight.backend).kind
            ttft = None if flight.first_at is None else flight.first_at - flight.sent
            duration = self.clock.now - flight.sent
            outcome = measured(
                flight.routed, kind, usage, ttft_s=ttft, duration_s=duration, stream=True, shared=shared
            )
        run_now(self.lifecycle.settle(Completion(flight.routed, flight.task.id, 200, None, outcome)))
