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

Pacing is the wall replay's (``runner``): a conversation's next turn is sent at ``max(its arrival,
the previous turn's end)``, anything else at its arrival. Everything is a function of the trace and
the options: the same inputs give the same results, byte for byte.
"""

from __future__ import annotations

import itertools
import time
from collections.abc import Coroutine, Mapping, Sequence
from dataclasses import dataclass
from functools import partial
from typing import Any, TypeVar

import httpx
import msgspec

from backends.base import Documents
from backends.clock import Events
from backends.errors import UpstreamStatusError, parse_error_body
from backends.sim import SimConfig, tokenizer
from backends.sim.chat import render_chat
from backends.sim.drive import EventDriver
from backends.sim.engine_base import BatchEngine
from backends.sim.engines import create_engine
from backends.sim.generation import Answer, DeltaKind, OutToken
from backends.sim.inprocess import EngineDocuments, final_usage
from backends.sim.task import SimTask, Update, UpdateKind
from backends.sim.vllm_engine import VllmEngine
from backends.sim.vllm_errors import context_error
from gateway.completion import Completion, measured
from gateway.core import build_core, one_replica
from gateway.errors import GatewayError
from gateway.lifecycle import in_flight
from gateway.replay.results import Result, request_body, request_headers
from gateway.replay.synth import prompt_tokens
from gateway.replay.traces import BLOCK_TOKENS, TraceRequest, conversations
from gateway.retry import after_failure, gave_up
from gateway.routed import Routed
from gateway.settings import Settings
from gateway.warming import learn_from, warm_sent, warmed
from policies import Endpoint
from policies.types import Usage, WarmUp

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
    engine = create_engine(config, events.clock)
    EventDriver(engine, events)
    return engine


@dataclass(frozen=True, slots=True)
class VirtualOptions:
    """How a virtual replay runs: the gateway's own time per request, the synthesized blocks' size."""

    overhead_s: float = OVERHEAD_S
    block_tokens: int = BLOCK_TOKENS


DEFAULT_OPTIONS = VirtualOptions()


@dataclass(slots=True)
class Flight:
    """One request on its way to an engine: where it went and what was seen of it so far."""

    index: int
    sent: float
    backend: str
    task: SimTask
    first_at: float | None = None
    routed: Routed | None = None
    token: int = -1  # the fleet's note of it (the gateway's replay)
    excluded: frozenset[str] = frozenset()


class World:
    """The trace's clients and the engine models on one event loop: pacing, sending a request to an
    engine after the gateway's own time, its updates, and the results. Who picks the engine (the
    gateway, the oracle) is a subclass: :meth:`send`, and the hooks below."""

    def __init__(
        self, requests: Sequence[TraceRequest], configs: Mapping[str, SimConfig], options: VirtualOptions
    ) -> None:
        self.requests = requests
        self.options = options
        self.events = Events()
        self.clock = self.events.clock
        self.engines = {name: engine_for(config, self.events) for name, config in configs.items()}
        self.results: dict[int, Result] = {}
        self._next_turn: dict[int, int] = {}
        self._attempts = itertools.count()
        self.wall_s = 0.0

    def run(self) -> list[Result]:
        """Replay every request; results in trace order."""
        started = time.perf_counter()
        for chain in conversations(self.requests):
            for this, following in itertools.pairwise(chain):
                self._next_turn[this] = following
            self.events.at(self.requests[chain[0]].t, partial(self._send, chain[0]))
        self.begin()
        self.events.run()
        self.wall_s = time.perf_counter() - started
        return [self.results[i] for i in range(len(self.requests))]

    @property
    def simulated_s(self) -> float:
        """Simulated seconds from the trace start to the last event."""
        return self.clock.now

    @property
    def pending(self) -> bool:
        """Requests remain to be answered."""
        return len(self.results) < len(self.requests)

    def _send(self, index: int) -> None:
        request = self.requests[index]
        if request.messages is None:
            tokens = prompt_tokens(request, self.options.block_tokens)
        else:  # literal messages: what the simulators make of them (the toy tokenizer: slower)
            tokens = tokenizer.encode(render_chat(list(request.messages)))
        self.send(index, request, tokens)

    # --- the subclass's part -------------------------------------------------------------------------

    def begin(self) -> None:
        """Before the first request (the gateway probes its engines)."""

    def send(self, index: int, request: TraceRequest, tokens: list[int]) -> None:
        """Route request ``index`` (its engine tokens given) and :meth:`dispatch` it, or :meth:`fail`."""
        raise NotImplementedError

    def first_token(self, flight: Flight) -> None:
        """The request's first token arrived."""

    def refused(self, flight: Flight, error: UpstreamStatusError) -> None:
        """The engine refused the request before any token (a prompt too long for it)."""
        self.fail(flight.index, flight.sent, error.message)

    def done(self, flight: Flight, usage: Usage | None) -> None:
        """The request finished with ``usage``."""

    # --- engines -------------------------------------------------------------------------------------

    def dispatch(self, flight: Flight, slot: int | None) -> None:
        """Send ``flight`` to its engine (pinned to ``slot`` on llama.cpp) after the gateway's own time.
        Both engines cap the answer at what the window leaves; vLLM refuses a prompt too long for it."""
        engine, task = self.engines[flight.backend], flight.task
        room = max(engine.config.context_window - len(task.prompt), 0)
        answer = Answer(task.answer.tokens[:room], task.answer.finish_reason, None)
        attempt = SimTask(f"{task.id}.{next(self._attempts)}", task.prompt, answer)
        attempt.id_slot = slot if slot is not None else -1
        attempt.listener = partial(self._update, flight, attempt)
        engine.n_tasks += 1
        refusal = refused_by_vllm(engine, flight.backend, attempt)
        if refusal is not None:
            self.events.after(self.options.overhead_s, partial(self.refused, flight, refusal))
        else:
            self.events.after(self.options.overhead_s, partial(engine.submit, attempt))

    def _update(self, flight: Flight, attempt: SimTask, update: Update) -> None:
        if update.kind is UpdateKind.TOKEN:
            if flight.first_at is None:
                flight.first_at = self.clock.now
                self.first_token(flight)
        elif update.kind is UpdateKind.DONE:
            engine = self.engines[flight.backend]
            usage = final_usage(engine, attempt)
            self.done(flight, usage)
            self.finish(self.result(flight, attempt, usage))
        elif update.kind is UpdateKind.ERROR:
            assert update.error is not None
            body = msgspec.json.encode(update.error.body)
            self.refused(flight, parse_error_body(flight.backend, update.error.status, body))

    def result(self, flight: Flight, attempt: SimTask, usage: Usage | None) -> Result:
        """What the client measured of a finished request (simulated seconds)."""
        request, now = self.requests[flight.index], self.clock.now
        return Result(
            index=flight.index,
            session=request.session,
            arrival_s=request.t,
            start_s=flight.sent,
            backend=flight.backend,
            ttft_s=None if flight.first_at is None else flight.first_at - flight.sent,
            completion_s=now - flight.sent,
            prompt_tokens=usage.prompt_tokens if usage else len(attempt.prompt),
            cached_tokens=(usage.cached_tokens or 0) if usage else 0,
            completion_tokens=usage.completion_tokens if usage else attempt.n_emitted,
        )

    def fail(self, index: int, sent: float, error: str) -> None:
        request = self.requests[index]
        self.finish(
            Result(index, request.session, request.t, sent, None, None, self.clock.now - sent, 0, 0, 0, error)
        )

    def finish(self, result: Result) -> None:
        """A request ended: its result, then its conversation's next turn."""
        self.results[result.index] = result
        following = self._next_turn.pop(result.index, None)
        if following is not None:
            self.events.at(max(self.requests[following].t, self.clock.now), partial(self._send, following))


def refused_by_vllm(engine: BatchEngine, backend: str, task: SimTask) -> UpstreamStatusError | None:
    """vLLM's own check before it queues a request (``vllm_errors.context_error``); None elsewhere."""
    if not isinstance(engine, VllmEngine):
        return None
    refused = context_error(len(task.prompt), len(task.answer.tokens) or None, engine.config.context_window)
    if refused is None:
        return None
    return parse_error_body(backend, refused.status_code or 400, bytes(refused.content))


def answer_of(request: TraceRequest) -> Answer:
    """``max_tokens`` tokens (the replay sends ``ignore_eos``)."""
    return Answer((ANSWER_TOKEN,) * request.max_tokens, "length", None)


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
        self._counts: dict[str, int] = {}  # prompt text -> the engine's tokens, for the request in hand
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
        if isinstance(messages, list) and len(messages) == 1 and isinstance(messages[0], dict):
            content = messages[0].get("content")
            return self._counts.get(content) if isinstance(content, str) else None
        return None

    def send(self, index: int, request: TraceRequest, tokens: list[int]) -> None:
        body = request_body(request, self.options.block_tokens)
        content = body["messages"][0]["content"] if request.messages is None else None
        if content is not None:
            self._counts[content] = len(tokens)
        try:
            routed = run_now(self.lifecycle.route(body, Endpoint.CHAT, request_headers(request)))
        except GatewayError as exc:
            self.fail(index, self.clock.now, exc.message)
            return
        finally:
            if content is not None:
                self._counts.pop(content, None)
        task = SimTask(f"r{index}", tokens, answer_of(request))
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
        task = SimTask(f"{flight.task.id}.warm", flight.task.prompt, Answer((ANSWER_TOKEN,), "length", None))
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
