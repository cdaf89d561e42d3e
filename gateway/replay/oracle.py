"""The hindsight oracle: per request, the best engine (and llama.cpp slot) under the simulators' TRUE
state at arrival, knowing the rest of the trace.

At each request's send time it asks every simulator ``POST /_sim/whatif`` (simulator-only, see
``backends/sim/whatif.py``) with the request body: the cached tokens and predicted TTFT ``now(c)`` of
each candidate ``c`` (vLLM, and every llama.cpp slot). Being a hindsight oracle it also knows the
conversation's remaining turns ``j`` (prompt ``P_j``, growth ``g_j = P_j - P_{j-1}``), and scores

    score(c) = now(c) + future(c) + evict(c)
    future(vLLM)       = sum_j P_j / rate_vllm                     (hybrid, no prefix cache: re-prefill)
    future(llama slot) = sum_j (g_j + WARM_OVERHEAD) / rate_llama  (warm slot: growth + checkpoint gap)
    evict(llama slot)  = future_vllm(o) - future_llama(o) of the session ``o`` whose turn last ran on
                         that slot, over ``o``'s turns still to come (0 when it has none)

then sends the request straight to the lowest score (pinning the slot with ``id_slot`` on llama.cpp).
Conversations are the replay's (``traces.conversations``): by session id, and in a trace without
session ids by content (a turn resends the previous one's whole prompt), so the oracle sees the same
future in both formats. A request of no conversation has no future: it takes the fastest candidate
that evicts no live session's warm slot. Ties keep vLLM, then the lower slot id. Decisions are
serialized: the next one starts once the engine answered the previous request's headers, or after
``SETTLE_S`` wall seconds (a llama.cpp request queued behind a busy slot gets no headers), so a burst
of simultaneous arrivals does not all see the same idle engine. The oracle is greedy per request and
ignores queueing of future turns; it skips the gateway, so its TTFTs carry no gateway overhead.
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
from backends.sim.prefix_cache import CHECKPOINT_OFFSETS
from gateway.replay.client import Measured, stream_chat
from gateway.replay.traces import TraceRequest, conversations

SETTLE_S = 0.02
"""Wall seconds a decision waits, at most, for the engine to take the request before the next one."""
WARM_OVERHEAD = CHECKPOINT_OFFSETS[0] + 8
"""Tokens a warm hybrid llama.cpp slot re-prefills beyond the growth (checkpoint gap + chat template)."""


@dataclass(frozen=True, slots=True)
class Candidate:
    """One place a request can go, with its predicted TTFT now (simulated seconds)."""

    backend: str
    slot: int | None
    ttft_s: float
    cached_tokens: int


@dataclass(frozen=True, slots=True)
class Horizon:
    """A request's session future: simulated prefill seconds of its remaining turns on each engine."""

    vllm_s: float = 0.0
    llama_s: float = 0.0

    @property
    def savings_s(self) -> float:
        """What staying on a warm llama.cpp slot saves over going to vLLM: ``max(vllm - llama, 0)``."""
        return max(self.vllm_s - self.llama_s, 0.0)


def horizons(requests: Sequence[TraceRequest], rate_vllm: float, rate_llama: float) -> list[Horizon]:
    """Per request, the :class:`Horizon` of the turns its conversation has after it (formulas: module
    doc); conversations as the replay paces them (``traces.conversations``: by session, else by content)."""
    out = [Horizon() for _ in requests]
    for indices in conversations(requests):
        vllm = llama = 0.0
        for position in range(len(indices) - 1, -1, -1):
            out[indices[position]] = Horizon(vllm, llama)
            request = requests[indices[position]]
            previous = requests[indices[position - 1]].input_tokens if position else 0
            vllm += request.input_tokens / rate_vllm
            llama += (max(request.input_tokens - previous, 0) + WARM_OVERHEAD) / rate_llama
    return out


def score(candidate: Candidate, horizon: Horizon, evicted: Horizon | None) -> float:
    """``now + future + evict`` of one candidate (module docstring)."""
    if candidate.backend == "vllm":
        return candidate.ttft_s + horizon.vllm_s
    lost = evicted.savings_s if evicted is not None else 0.0
    return candidate.ttft_s + horizon.llama_s + lost


def choose(
    candidates: Sequence[Candidate], horizon: Horizon, owners: Mapping[int, Horizon | None]
) -> Candidate | None:
    """The lowest-scoring candidate; ``owners`` maps a llama.cpp slot to the horizon of its last session."""
    best: Candidate | None = None
    best_score = math.inf
    for candidate in candidates:
        evicted = owners.get(candidate.slot) if candidate.slot is not None else None
        value = score(candidate, horizon, evicted)
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


class Oracle:
    """Dispatches each request to the candidate :func:`choose` picks, straight to the simulator."""

    def __init__(
        self, requests: Sequence[TraceRequest], urls: Mapping[str, str], configs: Mapping[str, SimConfig]
    ) -> None:
        self.requests = requests
        self.urls = dict(urls)
        self.horizons = horizons(requests, configs["vllm"].prefill_tok_s, configs["llama"].prefill_tok_s)
        self.slot_owner: dict[int, int] = {}  # llama slot -> index of the last request sent to it
        self.conversation = {i: n for n, group in enumerate(conversations(requests)) for i in group}
        self._deciding = asyncio.Lock()

    def _owners(self, index: int) -> dict[int, Horizon | None]:
        out: dict[int, Horizon | None] = {}
        for slot, owner in self.slot_owner.items():
            same = self.conversation[owner] == self.conversation[index]
            out[slot] = None if same else self.horizons[owner]
        return out

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
            pick = choose(found, self.horizons[index], self._owners(index))
            if pick is None:
                return Measured(None, None, 0.0, 0, 0, 0, "fits on no simulator")
            if pick.slot is not None:
                body = {**body, "id_slot": pick.slot}
                self.slot_owner[pick.slot] = index
            responded = asyncio.Event()
            url = f"{self.urls[pick.backend]}/v1/chat/completions"
            sending = asyncio.create_task(
                stream_chat(client, url, body, backend=pick.backend, responded=responded)
            )
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(responded.wait(), SETTLE_S)
        return await sending
