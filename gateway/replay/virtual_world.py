"""The virtual replay's world: the trace's clients and the engine models on one discrete-event loop
(``backends.clock.Events``), with no router. ``World`` paces the requests, sends each to an engine
model after the gateway's own time, follows its updates and keeps the results; who picks the engine
is a subclass: the gateway (``virtual.GatewayReplay``) or the hindsight oracle
(``virtual_oracle.OracleReplay``).

Pacing is the wall replay's (``runner``): a conversation's next turn is sent at ``max(its arrival,
the previous turn's end)``, anything else at its arrival.
"""

from __future__ import annotations

import itertools
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from functools import partial

import msgspec

from backends.clock import Events
from backends.errors import UpstreamStatusError, parse_error_body
from backends.sim import SimConfig, tokenizer
from backends.sim.chat import render_chat
from backends.sim.drive import EventDriver
from backends.sim.engine_base import BatchEngine
from backends.sim.engines import create_engine
from backends.sim.generation import Answer, DeltaKind, OutToken
from backends.sim.inprocess import final_usage
from backends.sim.requests import user_starts as message_user_starts
from backends.sim.task import SimTask, Update, UpdateKind
from backends.sim.vllm_engine import VllmEngine
from backends.sim.vllm_errors import context_error
from gateway.replay.results import Result
from gateway.replay.synth import prompt_tokens, threaded, user_starts
from gateway.replay.traces import BLOCK_TOKENS, TraceRequest, conversations
from gateway.routed import Routed
from policies.types import Usage

OVERHEAD_S = 0.0016
"""The gateway's own time per request by default: turnout's added TTFT at one streamed request at
a time (``bench/overhead.py``, docs/benchmarks.md)."""
ANSWER_TOKEN = OutToken(0, " ok", DeltaKind.TEXT)
"""Every generated token (``ignore_eos`` answers; their ids matter only to a slot's cached tokens)."""


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
    answer_cap: bool = False
    """Send each answer's length as ``max_tokens`` (``results.request_body``): off, as clients do."""


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
        self.requests = threaded(requests, options.block_tokens)
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
        self.send(index, self.requests[index], self.task_of(index))

    def task_of(self, index: int) -> SimTask:
        """Request ``index`` as an engine gets it: the prompt's tokens, where its last and first user
        messages start (llama.cpp checkpoints there), and the answer."""
        request = self.requests[index]
        if request.messages is None:
            tokens = prompt_tokens(request, self.options.block_tokens)
            last, first = user_starts(request)
        else:  # literal messages: what the simulators make of them (the toy tokenizer: slower)
            messages = list(request.messages)
            tokens = tokenizer.encode(render_chat(messages))
            last, first = message_user_starts(messages, None)
        return SimTask(f"r{index}", tokens, answer_of(request), user_start=last, first_user=first)

    # --- the subclass's part -------------------------------------------------------------------------

    def begin(self) -> None:
        """Before the first request (the gateway probes its engines)."""

    def send(self, index: int, request: TraceRequest, task: SimTask) -> None:
        """Route request ``index`` (``task``: as its engine gets it, :meth:`task_of`) and :meth:`dispatch`
        it, or :meth:`fail`."""
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
        attempt = SimTask(
            f"{task.id}.{next(self._attempts)}",
            task.prompt,
            answer,
            user_start=task.user_start,
            first_user=task.first_user,
        )
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
