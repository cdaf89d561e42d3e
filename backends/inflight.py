"""Requests turnout has in flight, laid over the probes' snapshots.

A probe is up to ``probe_interval_s`` old; a burst routed on it alone would all pick the backend that
looked idle, and a slot turnout's own request just left would still look busy. So:

- a request begun after a snapshot counts as running there (its llama.cpp slot as busy), beyond
  the slot count as queued; one the snapshot saw that has ended since no longer runs;
- vLLM's waiting requests (``queued``) leave out those of turnout's the snapshot may have caught
  waiting for the next engine step (sent up to ``STEP_LAG_S`` before it, prompt not done by then):
  a probe often sees one, and its prompt is in the backlog already. Counted again as waiting, each
  added ``service_s / running`` to every queue until the next probe. One sent earlier and still
  without a first token waits to be admitted (the batch is full): it counts (val-burst-70: with
  every request of turnout's taken out, 60 waiting behind 179 running read as a 3-20 s queue);
- a slot whose request of turnout's ended after the snapshot, or less than ``RELEASE_LAG_S``
  before it (the engine releases a slot a moment after its last event), is idle again;
- a slot running a request of turnout's says how long it is still predicted to be busy, ``busy_s``:
  turnout's requests pinned there run one after the other, in the order sent, each starting when
  it was sent or when the one before it is predicted to end, whichever is later, and taking its
  predicted total less its predicted wait (that wait is the chain itself: ``busy_until``); one past
  its predicted end is still running (the prediction was short) and is given ``OVERDUE_FLOOR`` of
  its run more. A request queued behind others has not started: the time it has waited does not
  count against its own run;
- a request pinned behind another of turnout's on its slot is predicted to start when that one was
  predicted to end, even when that one ran long and has only just ended: the slot then looks nearly
  free while the request has only begun (chat's busy slots are predicted 1.5-2.5 s short for it).
  Starting the chain when the previous request really ended predicts them right, and routes worse
  (issue #45: contention-16-8llama's seed 29 went from 1.75 to 2.09 s, 1.20x dynamo-kv): sessions
  then leave warm slots whose wait the greedy objective now sees, for cold ones. Left as it is until
  the objective can take it (docs/benchmarks.md, 2026-12-05);
- a llama.cpp slot whose request of turnout's ended after the latest request began on its backend
  is ``unsaved``: llama-server copies every idle slot's state into its RAM cache after each launch
  (``--cache-idle-slots``, on by default), so the next request there waits for that copy
  (``policies.cost``: the profile's ``cache.ram_save_s``); requests the engine placed itself (not
  pinned) mark no slot;
- every backend says how many of turnout's requests began there per second over the last
  ``ARRIVALS_WINDOW_S``, ``arrivals_per_s`` (ended ones too; this replica's only: the others publish
  their backlog, not their arrivals), which prices what a request costs those that come next
  (``policies.cost``);
- every backend says how many seconds of prompt processing turnout's requests there still need,
  ``prefill_backlog_s``: each request's predicted prefill time, worked off over its predicted span
  from the end of its predicted queue wait (the prefill plus, on vLLM, the decode steps run with its
  chunks: ``Sent.interleaved_s``), and nothing once its first token arrived. Both engines process
  the prompt chunks of earlier requests first, so a new request's first token waits for that
  backlog. Streamed requests without a first token say more: their prompts are not done, whatever
  their predictions say, and the engine has worked on them only since the latest first token of the
  oldest streamed prompt still waiting there (``backends.sent.seen_left_s``); the backlog is at
  least that. (A llama.cpp prompt deferred for its slot counts as waiting there too: it keeps that
  clock until its first token, and the estimate errs low.) A request not streamed, or whose answer
  comes whole (the Envoy picker's buffered mode), tells nothing before it ends: its prediction
  stands. A llama.cpp request deferred for its slot is not in the engine yet and comes after a
  request sent now to an idle slot: its prompt is kept apart, ``deferred_prefill_s`` (a request
  waits behind turnout's own request on its slot until that one ends, and for work a probe saw
  there, not of turnout's, as long as predicted: ``Sent.deferred_s``; streamed, until its first
  token: past its predicted span it has still not run). Issue #45: counted in the backlog, it made
  a session's idle warm slot look 4 s slow, and the session left for a cold one.

Other gateway replicas on the same engines publish their requests' ``Load`` (``gateway.replicas``):
their prefill backlog adds to this one's, less the time since they measured it (the engine works it
off meanwhile; a request that has finished since must not keep a session off its warm slot).
Their running requests and busy slots are not laid over: the engines' own counts, in the next probe,
include them, while a replica's publication is up to a second old (a slot its request just left
would look busy, and a session that alternates replicas would wait for its own previous turn).
"""

from __future__ import annotations

import itertools
import math
from collections import deque

from msgspec.structs import replace

from backends.load import NONE_OWN, Load, Own
from backends.sent import Sent, busy_until, seen_left_s
from policies.types import BackendSnapshot, SlotState

ARRIVALS_WINDOW_S = 30.0
"""How far back ``arrivals_per_s`` counts the requests begun on a backend."""
STEP_LAG_S = 1.0
"""A vLLM probe this much younger than a request of turnout's may have caught it waiting for the
engine's next step (its prompt is in the backlog already); one waiting longer waits to be admitted."""
FORGET_AFTER_S = 3600.0  # a request not ended by then was lost
RELEASE_LAG_S = 1.0
"""A slot turnout's request left is still taken for free in a probe this much younger than the
request's end: llama-server releases the slot after its last event, and a probe taken in between
(a busy machine: tens to hundreds of milliseconds) still sees it processing. Trusting that probe made
a session's next turn leave its warm slot for the idle one."""


class InFlight:
    """Turnout's requests in flight and the slots they recently left (module docstring).

    Kept per backend, in the order they were sent, with the ones still prefilling and the ones
    pinned to a slot apart, and a count of those sent since the backend's last probe: laying them
    over a snapshot costs what the few pinned or still prefilling need, not one look at every
    request in flight (5,000 open streams made that most of the gateway's CPU). A request leaves the
    prefilling ones at its first token; one not streamed, once its predicted prefill is over (it
    adds nothing more: nothing will tell it is done).
    """

    def __init__(self) -> None:
        self._backend: dict[int, str] = {}  # token -> backend
        self._open: dict[str, dict[int, Sent]] = {}  # per backend, oldest first
        self._prefilling: dict[str, dict[int, Sent]] = {}  # per backend, no first token yet
        self._slotted: dict[str, dict[int, Sent]] = {}  # per backend, pinned to a slot
        self._probed_at: dict[str, float] = {}  # per backend, when its last probe (``seen``) was taken
        self._newer: dict[str, int] = {}  # per backend, requests open that began after that probe
        self._gone: dict[str, int] = {}  # per backend, requests that probe saw running, ended since
        self._begun: dict[str, int] = {}  # per backend, requests that probe saw prefilling, past it since
        self._ended: dict[tuple[str, int], float] = {}
        self._arrivals: dict[str, deque[float]] = {}  # per backend, when its recent requests began
        self._launched: dict[str, float] = {}  # per backend, when its latest request began
        self._done: dict[str, dict[int, tuple[float, int]]] = {}  # per backend and slot: end, tokens; unsaved
        self._tokens = itertools.count()
        self._unprefilled: dict[int, int] = {}  # token -> prompt tokens, until its first token
        self._own: dict[str, Own] = {}  # per backend: requests, their prompt tokens, those before a token
        self._shared: set[int] = set()  # requests whose prefill a warm-up's overlapped (``shared``)
        self._first_at: dict[str, float] = {}  # per backend, when the engine got past its streamed prompts
        self._waiting: dict[str, dict[int, None]] = {}  # per backend, streamed prompts before a token

    def __bool__(self) -> bool:
        # and while slots wait to be saved (the next launch on their backend waits for it)
        return bool(self._backend or self._ended or any(self._gone.values()) or any(self._done.values()))

    def begin(self, request: Sent) -> int:
        token = next(self._tokens)
        backend = request.backend_id
        if request.holds:  # a token count launches no task: it saves no slot
            self._arrivals.setdefault(backend, deque()).append(request.started)
            self._launched[backend] = max(self._launched.get(backend, -math.inf), request.started)
        self._backend[token] = backend
        self._open.setdefault(backend, {})[token] = request
        if request.prefill_s > 0:
            self._overlap(token, request)
            self._prefilling.setdefault(backend, {})[token] = request
            if request.stream:
                self._waiting.setdefault(backend, {})[token] = None
        if request.slot is not None:
            self._slotted.setdefault(backend, {})[token] = request
        if request.started > self._probed_at.get(backend, -math.inf):
            self._newer[backend] = self._newer.get(backend, 0) + 1
        self._unprefilled[token] = request.prompt_tokens
        own = self._own.get(backend, NONE_OWN)
        self._own[backend] = Own(
            own.requests + 1, own.tokens + request.prompt_tokens, own.prefilling + request.prompt_tokens
        )
        return token

    def _overlap(self, token: int, request: Sent) -> None:
        """Note the requests whose prompt processing is predicted to overlap ``request``'s, where
        one of the two is a warm-up (``Sent.warm``): llama-server runs both in the same batches,
        and the engine's timings of each then span the other's too."""
        begins = request.started + request.queue_s
        for other, sent in self._prefilling.get(request.backend_id, {}).items():
            if (
                (sent.warm or request.warm)
                and sent.started + sent.queue_s < request.prefilled_by
                and begins < sent.prefilled_by
            ):
                self._shared.update((token, other))

    def shared(self, token: int) -> bool:
        """Whether a warm-up's prompt processing overlapped this request's (``Fleet.end`` asks as it
        ends: its engine's prefill timing then spans the warm-up's too)."""
        return token in self._shared

    def own(self, backend: str) -> Own:
        """Turnout's own requests open on ``backend`` (what any router knows of its own traffic)."""
        return self._own.get(backend, NONE_OWN)

    def _first_token(self, token: int, backend: str) -> None:
        tokens = self._unprefilled.pop(token, None)
        if tokens is not None:
            own = self._own[backend]
            self._own[backend] = Own(own.requests, own.tokens, own.prefilling - tokens)

    def prefilled(self, token: int, now: float, *, seen: bool = True) -> None:
        """The request's first token arrived (at ``now``): its prompt is no longer part of the
        backlog. The oldest streamed prompt still waiting there: the engine is on the next ones from
        now (``seen_left_s``); ``seen`` False: its prompt left the engine without a first token (a
        data plane's fallback answered), which says nothing of the others."""
        backend = self._backend.get(token)
        if backend is None:
            return
        request = self._open[backend][token]
        waiting = self._waiting.get(backend, {})
        if seen and waiting and next(iter(waiting)) == token:
            self._first_at[backend] = now
        waiting.pop(token, None)
        self._first_token(token, backend)
        self._prefilling.get(backend, {}).pop(token, None)
        if request.prefill_s > 0:
            self._open[backend][token] = replace(request, prefill_s=0.0)
            if self._caught(request, self._probed_at.get(backend, -math.inf)):
                self._begun[backend] = self._begun.get(backend, 0) + 1

    def end(self, token: int, now: float) -> str | None:
        """The request is over; returns its backend (None if it was ended already)."""
        request = self._drop(token)
        if request is None:
            return None
        if request.slot is not None:
            self._ended[(request.backend_id, request.slot)] = now
            self._done.setdefault(request.backend_id, {})[request.slot] = (now, max(request.prompt_tokens, 1))
        return request.backend_id

    def unsaved(self, backend: str) -> dict[int, int]:
        """The slots of ``backend`` whose request of turnout's ended after the latest one began there,
        with that request's prompt tokens:
        llama-server saves every idle slot to its RAM cache after each launch (``--cache-idle-slots``),
        so the next launch saves these (module docstring)."""
        done = self._done.get(backend)
        if not done:
            return {}
        launched = self._launched.get(backend, -math.inf)
        for slot in [slot for slot, (at, _) in done.items() if at <= launched]:
            del done[slot]  # saved by that launch
        return {slot: tokens for slot, (_, tokens) in done.items()}

    def _drop(self, token: int) -> Sent | None:
        self._shared.discard(token)
        backend = self._backend.pop(token, None)
        if backend is None:
            return None
        self._prefilling.get(backend, {}).pop(token, None)
        self._waiting.get(backend, {}).pop(token, None)
        self._slotted.get(backend, {}).pop(token, None)
        request = self._open[backend].pop(token)
        self._first_token(token, backend)
        own = self._own[backend]
        self._own[backend] = Own(own.requests - 1, own.tokens - request.prompt_tokens, own.prefilling)
        if request.started > self._probed_at.get(backend, -math.inf):
            self._newer[backend] -= 1
        elif backend in self._probed_at:
            self._gone[backend] = self._gone.get(backend, 0) + 1
        return request

    def seen(self, snapshot: BackendSnapshot) -> None:
        """A new probe of this backend: what it saw no longer needs laying over; lost requests go."""
        backend = snapshot.backend_id
        release = snapshot.taken_at - RELEASE_LAG_S
        for key in [k for k, at in self._ended.items() if k[0] == backend and at < release]:
            del self._ended[key]
        stale = snapshot.taken_at - FORGET_AFTER_S
        lost = []
        for token, request in self._open.get(backend, {}).items():  # oldest first
            if request.started >= stale:
                break
            lost.append(token)
        for token in lost:
            self._drop(token)
        self._probed_at[backend] = snapshot.taken_at
        self._newer[backend] = self._count_newer(backend, snapshot.taken_at)
        self._gone[backend] = self._begun[backend] = 0

    @staticmethod
    def _caught(request: Sent, probed_at: float) -> bool:
        """Whether a vLLM probe taken at ``probed_at`` may have counted ``request`` waiting for the
        engine's next step (its prompt in the backlog already); one sent earlier that still waited
        waited to be admitted (module docstring)."""
        return probed_at - STEP_LAG_S <= request.started <= probed_at

    def _count_newer(self, backend: str, since: float) -> int:
        """Requests open on ``backend`` that began after ``since`` (newest first: they were sent in order)."""
        mine = reversed(self._open.get(backend, {}).values())
        return sum(1 for _ in itertools.takewhile(lambda r: r.started > since, mine))

    def _backlog(self, backend: str, now: float) -> tuple[float, float, float]:
        """Seconds of prompt processing still predicted for ``backend``'s requests: of those in the
        engine, of those deferred for a busy llama.cpp slot (behind a request of turnout's open
        on their slot, or predicted to wait for others' work there: ``Sent.deferred_at``), and of
        the first, the warm-ups' (``Sent.warm``); those whose prediction is over leave the
        prefilling ones (they would only ever add 0)."""
        prefilling = self._prefilling.get(backend)
        if not prefilling:
            return 0.0, 0.0, 0.0
        over = [token for token, r in prefilling.items() if r.prefilled_by <= now and not r.stream]
        for token in over:
            del prefilling[token]
        first: dict[int, Sent] = {}  # per slot, the oldest request of turnout's open there: it runs
        for request in self._slotted.get(backend, {}).values():
            first.setdefault(request.slot, request)  # type: ignore[arg-type]
        engine = deferred = warming = predicted = 0.0
        watched: list[Sent] = []  # streamed, in the engine: their first tokens say what is left
        for request in prefilling.values():
            behind = request.slot is not None and first.get(request.slot) is not request
            if behind or request.deferred_at(now):
                deferred += request.prefill_s
            else:
                left = request.prefill_left_s(now)
                engine += left
                warming += left if request.warm else 0.0
                if request.stream:
                    watched.append(request)
                    predicted += left
        seen = seen_left_s(watched, self._first_at.get(backend, -math.inf), now)
        return engine + max(seen - predicted, 0.0), deferred, warming

    def load(self, now: float) -> dict[str, Load]:
        """This replica's requests per backend, for the other replicas."""
        return {
            backend: Load(sum(self._backlog(backend, now)[:2]), len(requests), now)
            for backend, requests in self._open.items()
            if requests
        }

    def overlay(self, snapshot: BackendSnapshot, now: float, peers: Load | None = None) -> BackendSnapshot:
        """``snapshot`` with turnout's own requests, and the other replicas' ``peers``, laid over it
        (module docstring)."""
        backend = snapshot.backend_id
        rate = self.arrivals_per_s(backend, now)
        if rate:
            snapshot = replace(snapshot, arrivals_per_s=rate)
        release = snapshot.taken_at - RELEASE_LAG_S
        ended = {s for (b, s), at in self._ended.items() if b == backend and at > release}
        latest = snapshot.taken_at == self._probed_at.get(backend)
        gone = self._gone.get(backend, 0) if latest else 0
        unsaved = self.unsaved(backend) if snapshot.slots else {}
        if not self._open.get(backend) and not ended and not gone and peers is None and not unsaved:
            return snapshot
        slots = self._slots(snapshot, ended, now, unsaved)
        backlog, deferred, warming = self._backlog(backend, now)
        backlog += (peers or Load()).backlog_at(now)
        running, queued = self._counts(snapshot, latest, gone)
        return replace(
            snapshot,
            running=running,
            queued=queued,
            slots=slots,
            prefill_backlog_s=backlog,
            deferred_prefill_s=deferred,
            warming_s=warming,
        )

    def arrivals_per_s(self, backend: str, now: float) -> float:
        """Turnout's requests begun on ``backend`` per second over the last ``ARRIVALS_WINDOW_S``."""
        arrivals = self._arrivals.get(backend)
        if not arrivals:
            return 0.0
        while arrivals and arrivals[0] <= now - ARRIVALS_WINDOW_S:
            arrivals.popleft()
        return len(arrivals) / ARRIVALS_WINDOW_S

    def _slots(
        self, snapshot: BackendSnapshot, ended: set[int], now: float, unsaved: dict[int, int]
    ) -> tuple[SlotState, ...]:
        """The probe's slots, with turnout's requests since: busy where they were pinned after it,
        idle where one ``ended`` since, how long each slot running them is still busy, and which the
        next launch saves (``unsaved``)."""
        slotted = self._slotted.get(snapshot.backend_id, {}).values()
        chains: dict[int, list[Sent]] = {}  # per slot, in the order sent: they run one after the other
        for request in slotted:
            if request.slot is not None:
                chains.setdefault(request.slot, []).append(request)
        busy = {slot: busy_until(chain, now) - now for slot, chain in chains.items()}
        pinned = {r.slot for r in slotted if r.slot is not None and r.started > snapshot.taken_at}
        freed = ended - set(busy)  # the probe saw turnout's request there, which has ended since
        return tuple(
            replace(
                s,
                is_processing=(s.is_processing and s.id not in freed) or s.id in pinned,
                busy_s=busy.get(s.id),
                unsaved=unsaved.get(s.id, 0),
            )
            for s in snapshot.slots
        )

    def _counts(self, snapshot: BackendSnapshot, latest: bool, gone: int) -> tuple[int, int]:
        """The probe's running and queued requests, with turnout's since (module docstring); ``gone``:
        those it saw that have ended. Of a snapshot that is not the latest (``latest``) only the
        requests sent after it are known."""
        backend = snapshot.backend_id
        newer = self._newer[backend] if latest else self._count_newer(backend, snapshot.taken_at)
        running = max(snapshot.running - gone, 0) + newer
        capacity = snapshot.total_slots
        if capacity:
            return min(running, capacity), snapshot.queued + max(0, running - capacity)
        caught = sum(
            1 for r in self._prefilling.get(backend, {}).values() if self._caught(r, snapshot.taken_at)
        )
        caught += self._begun.get(backend, 0) if latest else 0
        return running, max(snapshot.queued - caught, 0)
