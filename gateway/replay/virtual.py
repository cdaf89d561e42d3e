"""Replay in virtual time: the trace's clients, the real router and the engine models on one
discrete-event loop (``backends.clock.Events``), with no HTTP, no threads and no wall clock.

What runs is the gateway's own request path minus its sockets: ``Relay.route`` (the catalog, the
prompt's features, the session, counting near a window, ``Router.decide`` with its policies,
learning, prefix index, slot leases and the in-memory state store), the fleet's in-flight overlay
(``Fleet.begin`` / ``prefilled`` / ``end``), and ``relay.settle`` (learning, the session's next
state, the decision log). The engines are the simulators' engine models under the event driver
(``backends.sim.drive.EventDriver``). What the gateway observes arrives as it would:

- **probes** every ``probe_interval_s`` of each backend, through the adapters' own probe code and
  parsers, answered in process from the simulators' renderers (``backends.sim.inprocess``); stale in
  between, with the in-flight overlay on top;
- the **first token** of each request at its simulated time (``Fleet.prefilled``), and its **usage**
  (llama.cpp ``timings`` included) parsed off the task's last event when it ends;
- the gateway's **own time** per request, ``overhead_s``: a request reaches its engine that long
  after it was sent.

Pacing is the wall replay's (``runner``): a conversation's next turn is sent at ``max(its arrival,
the previous turn's end)``, anything else at its arrival. Everything is a function of the trace and
the options: the same inputs give the same results, byte for byte.
"""

from __future__ import annotations

import itertools
import time
from collections.abc import Coroutine, Sequence
from dataclasses import dataclass
from functools import partial
from typing import Any, TypeVar

import httpx
import msgspec

from backends.base import Documents
from backends.clock import Events
from backends.errors import UpstreamStatusError, parse_error_body
from backends.fleet import Fleet
from backends.sim import SimConfig
from backends.sim.drive import EventDriver
from backends.sim.engine_base import BatchEngine
from backends.sim.generation import Answer, DeltaKind, OutToken
from backends.sim.inprocess import EngineDocuments, count_body, final_usage
from backends.sim.llama_engine import LlamaEngine
from backends.sim.task import SimTask, Update, UpdateKind
from backends.sim.vllm_engine import VllmEngine
from backends.sim.vllm_errors import context_error
from gateway.app import backend_specs, state_store
from gateway.catalog import Catalog
from gateway.errors import GatewayError
from gateway.relay import Relay, in_flight, measured, no_route_error, settle
from gateway.replay.runner import Result, request_body, request_headers
from gateway.replay.synth import prompt_tokens
from gateway.replay.traces import BLOCK_TOKENS, TraceRequest, conversations
from gateway.routing import Routed, Router, engine_counted
from gateway.settings import Settings
from policies import Endpoint
from policies.types import EngineKind

T = TypeVar("T")

OVERHEAD_S = 0.0016
"""The gateway's own time per request by default: turnout's added TTFT at one streamed request at
a time (``bench/overhead.py``, docs/benchmarks.md)."""
ANSWER_TOKEN = OutToken(0, " ok", DeltaKind.TEXT)
"""Every generated token (``ignore_eos`` answers; their ids matter only to a slot's cached tokens)."""


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


def engine_for(config: SimConfig, events: Events) -> BatchEngine:
    """An engine model of ``config`` on ``events``' clock, run by the event driver."""
    engine: BatchEngine = (
        LlamaEngine(config, clock=events.clock)
        if config.kind == "llamacpp"
        else VllmEngine(config, clock=events.clock)
    )
    EventDriver(engine, events)
    return engine


@dataclass(frozen=True, slots=True)
class VirtualOptions:
    """How a virtual replay runs: the gateway's own time per request, the synthesized blocks' size."""

    overhead_s: float = OVERHEAD_S
    block_tokens: int = BLOCK_TOKENS


@dataclass(slots=True)
class Flight:
    """One request on its way: where it went and what was seen of it so far."""

    index: int
    sent: float
    routed: Routed
    backend: str
    token: int
    task: SimTask
    excluded: frozenset[str] = frozenset()
    first_at: float | None = None


class VirtualReplay:
    """One replay of ``requests`` through a gateway with ``settings`` over ``configs`` (one engine
    model per backend id of the settings), on one event loop."""

    def __init__(
        self,
        requests: Sequence[TraceRequest],
        settings: Settings,
        configs: dict[str, SimConfig],
        options: VirtualOptions = VirtualOptions(),
    ) -> None:
        self.requests = requests
        self.options = options
        self.events = Events()
        self.clock = self.events.clock
        self.engines = {
            backend.id: engine_for(configs[backend.id], self.events) for backend in settings.backends
        }
        self._counts: dict[str, int] = {}  # prompt text -> the engine's tokens, for the requests in hand
        documents: dict[str, Documents] = {
            bid: EngineDocuments(engine, self._count) for bid, engine in self.engines.items()
        }
        catalog = Catalog(settings.models, created=int(self.clock.time()))
        client = httpx.AsyncClient(transport=NoHttp())
        self.fleet = Fleet(backend_specs(settings, catalog), client, clock=self.clock, documents=documents)
        router = Router(
            self.fleet,
            state_store(settings, self.clock),
            settings.routing_profile(),
            lease_idle_s=settings.state.lease_idle_s,
        )
        self.relay = Relay(
            self.fleet,
            catalog,
            router,
            retries=settings.limits.retries,
            max_body=settings.limits.max_body_bytes,
        )
        self.router = router
        self.results: dict[int, Result] = {}
        self._next_turn: dict[int, int] = {}
        self._ids = itertools.count()
        self.wall_s = 0.0

    # --- the loop ----------------------------------------------------------------------------------

    def run(self) -> list[Result]:
        """Replay every request; results in trace order."""
        started = time.perf_counter()
        for chain in conversations(self.requests):
            for this, following in itertools.pairwise(chain):
                self._next_turn[this] = following
            first = chain[0]
            self.events.at(self.requests[first].t, partial(self._send, first))
        for backend_id in self.engines:
            self._probe(backend_id)
        self.events.run()
        self.wall_s = time.perf_counter() - started
        return [self.results[i] for i in range(len(self.requests))]

    @property
    def simulated_s(self) -> float:
        """Simulated seconds from the trace start to the last event."""
        return self.clock.now

    def _probe(self, backend_id: str) -> None:
        """Probe now, and again after the backend's interval while requests remain."""
        adapter = self.fleet.adapter(backend_id)
        self.fleet.observe(run_now(adapter.probe()))
        if len(self.results) < len(self.requests):
            self.events.after(adapter.spec.probe_interval_s, partial(self._probe, backend_id))

    def _count(self, body: Any) -> int:
        messages = body.get("messages") if isinstance(body, dict) else None
        if isinstance(messages, list) and len(messages) == 1 and isinstance(messages[0], dict):
            content = messages[0].get("content")
            known = self._counts.get(content) if isinstance(content, str) else None
            if known is not None:
                return known
        return count_body(body)

    # --- one request -------------------------------------------------------------------------------

    def _send(self, index: int) -> None:
        request = self.requests[index]
        body = request_body(request, self.options.block_tokens)
        tokens = prompt_tokens(request, self.options.block_tokens)
        content = body["messages"][0]["content"] if request.messages is None else None
        if content is not None:
            self._counts[content] = len(tokens)
        try:
            routed = run_now(self.relay.route(body, Endpoint.CHAT, request_headers(request)))
        except GatewayError as exc:
            self._failed(index, self.clock.now, exc.message)
            return
        finally:
            if content is not None:
                self._counts.pop(content, None)
        answer = Answer((ANSWER_TOKEN,) * request.max_tokens, "length", None)
        task = SimTask(f"r{index}", tokens, answer)
        self._dispatch(index, self.clock.now, routed, task, frozenset())

    def _dispatch(
        self, index: int, sent: float, routed: Routed, task: SimTask, excluded: frozenset[str]
    ) -> None:
        decision = routed.decision
        if decision.chosen is None:
            self._failed(index, sent, no_route_error(decision, routed.features).message)
            return
        backend = decision.chosen.backend_id
        engine = self.engines[backend]
        token = self.fleet.begin(in_flight(decision, self.clock.time()))
        room = max(engine.config.context_window - len(task.prompt), 0)  # both engines cap the answer
        answer = Answer(task.answer.tokens[:room], task.answer.finish_reason, None)
        attempt = SimTask(f"{task.id}.{next(self._ids)}", task.prompt, answer)
        attempt.id_slot = decision.slot if decision.slot is not None else -1
        engine.n_tasks += 1
        flight = Flight(index, sent, routed, backend, token, attempt, excluded)
        attempt.listener = partial(self._update, flight)
        refusal = self._refusal(engine, backend, attempt)
        if refusal is not None:
            self.events.after(self.options.overhead_s, partial(self._refused, flight, refusal))
            return
        self.events.after(self.options.overhead_s, partial(engine.submit, attempt))

    @staticmethod
    def _refusal(engine: BatchEngine, backend: str, task: SimTask) -> UpstreamStatusError | None:
        """vLLM's own check before it queues a request (``vllm_errors.context_error``)."""
        if not isinstance(engine, VllmEngine):
            return None
        window = engine.config.context_window
        refused = context_error(len(task.prompt), len(task.answer.tokens) or None, window)
        if refused is None:
            return None
        return parse_error_body(backend, refused.status_code or 400, bytes(refused.content))

    def _update(self, flight: Flight, update: Update) -> None:
        if update.kind is UpdateKind.TOKEN:
            if flight.first_at is None:
                flight.first_at = self.clock.now
                self.fleet.prefilled(flight.token)
        elif update.kind is UpdateKind.DONE:
            self._done(flight)
        elif update.kind is UpdateKind.ERROR:
            assert update.error is not None
            body = msgspec.json.encode(update.error.body)
            error = parse_error_body(flight.backend, update.error.status, body)
            self._refused(flight, error)

    def _refused(self, flight: Flight, error: UpstreamStatusError) -> None:
        """The engine refused the request before any byte: as the relay does, a prompt too long for
        it goes to another backend on the engine's own count; anything else fails."""
        self.fleet.end(flight.token)
        if not error.context_exceeded or len(flight.excluded) >= self.relay.retries:
            self._failed(flight.index, flight.sent, error.message)
            return
        excluded = flight.excluded | {flight.backend}
        routed = engine_counted(flight.routed, error)
        routed = run_now(self.router.decide(routed.features, routed.session, excluded, routed.overflowed))
        self._dispatch(flight.index, flight.sent, routed, flight.task, excluded)

    def _done(self, flight: Flight) -> None:
        engine, task, now = self.engines[flight.backend], flight.task, self.clock.now
        usage = final_usage(engine, task)
        self.fleet.judge(flight.backend, None)
        self.fleet.end(flight.token)
        kind = EngineKind.LLAMACPP if isinstance(engine, LlamaEngine) else EngineKind.VLLM
        ttft = None if flight.first_at is None else flight.first_at - flight.sent
        outcome = None
        if usage is not None:
            outcome = measured(
                flight.routed, kind, usage, ttft_s=ttft, duration_s=now - flight.sent, stream=True
            )
        run_now(settle(self.router, flight.routed, task.id, outcome, 200, None))
        request = self.requests[flight.index]
        self._finish(
            Result(
                index=flight.index,
                session=request.session,
                arrival_s=request.t,
                start_s=flight.sent,
                backend=flight.backend,
                ttft_s=ttft,
                completion_s=now - flight.sent,
                prompt_tokens=usage.prompt_tokens if usage else len(task.prompt),
                cached_tokens=(usage.cached_tokens or 0) if usage else 0,
                completion_tokens=usage.completion_tokens if usage else task.n_emitted,
            )
        )

    def _failed(self, index: int, sent: float, error: str) -> None:
        request = self.requests[index]
        self._finish(
            Result(index, request.session, request.t, sent, None, None, self.clock.now - sent, 0, 0, 0, error)
        )

    def _finish(self, result: Result) -> None:
        """A request ended: its result, then its conversation's next turn."""
        self.results[result.index] = result
        following = self._next_turn.pop(result.index, None)
        if following is not None:
            self.events.at(max(self.requests[following].t, self.clock.now), partial(self._send, following))
