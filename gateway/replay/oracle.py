"""The hindsight oracle: per request, the best engine (and llama.cpp slot) under the simulators' TRUE
state at arrival, knowing the rest of the trace.

At each request's send time it asks every engine what the request would get there now
(``backends/sim/whatif.py``: over HTTP, ``POST /_sim/whatif``, in the wall-clock replay; by calling
it on the engine models in the virtual-time one): the cached tokens and predicted TTFT ``now(c)`` of
each candidate ``c`` (each engine without slots, and every llama.cpp slot). Being a hindsight
oracle it also knows the conversation's remaining turns ``j`` (prompt ``P_j``, growth
``g_j = P_j - P_{j-1}``), and scores, with ``rate_b`` the prefill rate of ``c``'s backend ``b``

    score(c) = now(c) + future(c) + evict(c)
    future(engine without slots) = sum_j P_j / rate_b                  (hybrid, no prefix cache: re-prefill)
    future(llama slot)           = sum_j (g_j + THREAD_TAIL) / rate_b (warm slot, a turn that goes on
                                   from the previous prompt, ``synth.threaded``: growth, the 4 tokens
                                   before the previous prompt's end, the new messages' template), or
                                   (g_j + gap_b + TEMPLATE_TAIL) / rate_b for a turn that rewrites the
                                   previous one's last message (the checkpoint gap of b's profile)
    evict(llama slot)            = elsewhere(o) - future_b(o) of the conversation ``o`` whose turn last
                                   ran on that slot, over ``o``'s turns still to come (0 when it has none,
                                   or when it is this request's own); elsewhere: cold on the fastest
                                   engine without slots

then sends the request straight to the lowest score (pinning the slot with ``id_slot`` on llama.cpp).
Conversations are the replay's (``traces.conversations``): by session id, and in a trace without
session ids by content (a turn resends the previous one's whole prompt), so the oracle sees the same
future in both formats. A request of no conversation has no future: it takes the fastest candidate
that evicts no live session's warm slot. Ties keep the first candidate (backends in configured
order, slots by id). In wall time decisions are serialized: the next one starts once the engine
answered the previous request's headers, or after ``SETTLE_S`` wall seconds (a llama.cpp request
queued behind a busy slot gets no headers), so a burst of simultaneous arrivals does not all see the
same idle engine; in virtual time each decision sees the engines as the previous one left them. The
oracle is greedy per request and ignores queueing of future turns. In wall time it skips the gateway
(its TTFTs carry no gateway overhead); in virtual time it pays the profiles' ``overhead_s``.
"""

from __future__ import annotations

import asyncio
import contextlib
import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import httpx

from backends.sim import SimConfig
from gateway.replay.client import Measured, stream_chat
from gateway.replay.synth import CLOSE, HEADS
from gateway.replay.traces import TraceRequest, conversations
from policies.checkpoints import CHECKPOINT_TAIL

SETTLE_S = 0.02
"""Wall seconds a decision waits, at most, for the engine to take the request before the next one."""
TEMPLATE_TAIL = 8
"""Tokens a warm hybrid llama.cpp slot re-prefills beyond the growth and its checkpoint gap when a turn
rewrites the previous one's last user message (it diverges where the previous prompt's template closed)."""
THREAD_TAIL = CHECKPOINT_TAIL + 2 * len(CLOSE) + len(HEADS["user"]) + len(HEADS["assistant"])
"""Tokens a warm hybrid llama.cpp slot re-prefills beyond the growth for a turn that goes on from the
previous prompt: from its checkpoint 4 tokens before that prompt's end, and the template of the
answer and the new user message (``synth.threaded``)."""


@dataclass(frozen=True, slots=True)
class Candidate:
    """One place a request can go, with its predicted TTFT now (simulated seconds)."""

    backend: str
    slot: int | None
    ttft_s: float
    cached_tokens: int


@dataclass(frozen=True, slots=True)
class Horizon:
    """A request's conversation future in tokens: what its remaining turns prefill on an engine that
    kept nothing of them (``cold``: their whole prompts) and on a warm llama.cpp slot (``warm``: their
    growth and a template tail each, and the slot's checkpoint gap once for each of the ``turns`` that
    do not go on from the previous prompt)."""

    cold: int = 0
    warm: int = 0
    turns: int = 0


@dataclass(frozen=True, slots=True)
class Engines:
    """The fleet as the oracle prices it: each backend's prefill rate (tokens/s) and which of them
    keep a session warm between turns (llama.cpp slots). A conversation's future is priced at each
    engine profile's nominal rate (``prefill_tok_s``, the cold 4k rate): per-batch costs are left out
    of the look-ahead (this turn's TTFT comes from the engine models' own what-if, which has them)."""

    rates: Mapping[str, float]
    gaps: Mapping[str, int]
    """The llama.cpp backends' checkpoint gaps (their profiles' ``checkpoint_gap``): these keep slots."""

    def future_s(self, backend: str, horizon: Horizon) -> float:
        """Seconds of prefill ``horizon`` costs if its conversation stays on ``backend``."""
        gap = self.gaps.get(backend)
        tokens = horizon.cold if gap is None else horizon.warm + horizon.turns * gap
        return tokens / self.rates[backend]

    def elsewhere_s(self, horizon: Horizon) -> float:
        """Seconds of prefill ``horizon`` costs on the fastest engine that keeps no slot (on the
        fastest of all, cold, when every engine has slots)."""
        cold = [r for b, r in self.rates.items() if b not in self.gaps] or list(self.rates.values())
        return horizon.cold / max(cold)


def horizons(requests: Sequence[TraceRequest]) -> list[Horizon]:
    """Per request, the :class:`Horizon` of the turns its conversation has after it (formulas: module
    doc); conversations as the replay paces them (``traces.conversations``: by session, else by
    content), turns as it sends them (``synth.threaded``: pass its requests)."""
    out = [Horizon() for _ in requests]
    for indices in conversations(requests):
        cold = warm = turns = 0
        for position in range(len(indices) - 1, -1, -1):
            out[indices[position]] = Horizon(cold, warm, turns)
            request = requests[indices[position]]
            previous = requests[indices[position - 1]] if position else None
            cold += request.input_tokens
            warm += max(request.input_tokens - (previous.input_tokens if previous else 0), 0)
            if previous is not None and len(request.splits) > len(previous.splits):
                warm += THREAD_TAIL
            else:
                warm += TEMPLATE_TAIL
                turns += 1
    return out


def score(candidate: Candidate, horizon: Horizon, evicted: Horizon | None, engines: Engines) -> float:
    """``now + future + evict`` of one candidate (module docstring)."""
    value = candidate.ttft_s + engines.future_s(candidate.backend, horizon)
    if candidate.slot is not None and evicted is not None:
        value += max(engines.elsewhere_s(evicted) - engines.future_s(candidate.backend, evicted), 0.0)
    return value


def scores(
    candidates: Sequence[Candidate],
    horizon: Horizon,
    owners: Mapping[tuple[str, int], Horizon | None],
    engines: Engines,
) -> list[float]:
    """Every candidate's score; ``owners`` maps a llama.cpp (backend, slot) to the horizon of the other
    conversation whose turn last ran there (None: its own, or none)."""
    out = []
    for candidate in candidates:
        slot = candidate.slot
        evicted = owners.get((candidate.backend, slot)) if slot is not None else None
        out.append(score(candidate, horizon, evicted, engines))
    return out


def choose(
    candidates: Sequence[Candidate],
    horizon: Horizon,
    owners: Mapping[tuple[str, int], Horizon | None],
    engines: Engines,
) -> Candidate | None:
    """The lowest-scoring candidate (the first on a tie)."""
    best: Candidate | None = None
    best_score = math.inf
    for candidate, value in zip(candidates, scores(candidates, horizon, owners, engines), strict=True):
        if value < best_score:
            best, best_score = candidate, value
    return best


def candidates_from(backend: str, whatif: Mapping[str, Any]) -> list[Candidate]:
    """The candidates in one ``/_sim/whatif`` answer (every llama.cpp slot from ``options``)."""
    options = whatif.get("options") or [whatif]
    return [
        Candidate(backend, o.get("slot"), float(o["ttft_s"]), int(o.get("cached_tokens") or 0))
        for o in options
        if o.get("fits") and o.get("ttft_s") is not None
    ]


def engines_of(configs: Mapping[str, SimConfig]) -> Engines:
    """The oracle's view of simulated engines by backend id."""
    rates = {name: config.prefill_tok_s for name, config in configs.items()}
    gaps = {
        name: c.engine_profile.prefill.checkpoint_gap for name, c in configs.items() if c.kind == "llamacpp"
    }
    return Engines(rates, gaps)


def owners(
    slot_owner: Mapping[tuple[str, int], int],
    conversation: Mapping[int, int],
    futures: Sequence[Horizon],
    index: int,
) -> dict[tuple[str, int], Horizon | None]:
    """Per llama.cpp (backend, slot), the horizon of the conversation whose turn last ran there,
    unless it is the conversation of request ``index``."""
    out: dict[tuple[str, int], Horizon | None] = {}
    for place, owner in slot_owner.items():
        out[place] = None if conversation[owner] == conversation[index] else futures[owner]
    return out


class Oracle:
    """Dispatches each request to the candidate :func:`choose` picks, straight to the simulator."""

    def __init__(
        self, requests: Sequence[TraceRequest], urls: Mapping[str, str], configs: Mapping[str, SimConfig]
    ) -> None:
        self.requests = requests
        self.urls = dict(urls)
        self.horizons = horizons(requests)
        self.engines = engines_of(configs)
        self.slot_owner: dict[tuple[str, int], int] = {}  # llama (backend, slot) -> its last request
        self.conversation = {i: n for n, group in enumerate(conversations(requests)) for i in group}
        self._deciding = asyncio.Lock()

    def _owners(self, index: int) -> dict[tuple[str, int], Horizon | None]:
        return owners(self.slot_owner, self.conversation, self.horizons, index)

    async def dispatch(
        self, client: httpx.AsyncClient, index: int, body: dict[str, Any], headers: dict[str, str]
    ) -> Measured:
        """Ask every simulator, pick (:func:`choose`), then send the request to the winner."""
        async with self._deciding:
            names = list(self.urls)
            answers = await asyncio.gather(
                *(client.post(f"{self.urls[n]}/_sim/whatif", json=body) for n in names)
            )
            found: list[Candidate] = []
            for name, answer in zip(names, answers, strict=True):
                if answer.status_code == 200:
                    found += candidates_from(name, answer.json())
            pick = choose(found, self.horizons[index], self._owners(index), self.engines)
            if pick is None:
                return Measured(None, None, 0.0, 0, 0, 0, "fits on no simulator")
            if pick.slot is not None:
                body = {**body, "id_slot": pick.slot}
                self.slot_owner[pick.backend, pick.slot] = index
            responded = asyncio.Event()
            url = f"{self.urls[pick.backend]}/v1/chat/completions"
            sending = asyncio.create_task(
                stream_chat(client, url, body, backend=pick.backend, responded=responded)
            )
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(responded.wait(), SETTLE_S)
        return await sending
