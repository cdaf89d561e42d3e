"""What a request costs the ones that come next (``others_s``): it holds what they need, and the cost
model (``policies.cost``) counts half of what they will wait for it.

    others = ``held_s``: OTHERS_SHARE * rate * hold * (queue + hold): each request arriving while this one
           waits and holds the engine waits for its hold (prompts are processed in order);
           vLLM: hold = its prefill;
           llama.cpp, a one-off (no proven session): rate / slots, hold = its whole run (each
           arriving for its slot waits for it; run = total - queue);
           a session's turn on llama.cpp: 0 (the slot is the session's: later one-offs would not
           have had it), but a session leaving the llama.cpp backend that holds its state (its
           last turn's slot there) pays its prefill as on vLLM: it re-prefills its conversation
           in the steps every slot there shares. Issue #45: without it, with two agents a slot
           on 8 llama-servers, a session whose slot the other agent was using moved to a shorter
           queue elsewhere 85 times in 388 requests (dynamo-kv's sessions: 12), re-prefilling
           20-30k tokens each time, and the fleet prefilled 3.6M tokens to dynamo-kv's 2.6M
           (mean TTFT 1.14x its); charged on every session's llama.cpp turn, agents' turns on
           the workstation rows left llama.cpp's warm slots for vLLM (contention-4 1.84 ->
           2.12 s);
           rate = turnout's requests begun per second lately on the candidate's engine kind,
           the mean over the candidates of that kind (``arrivals_per_s``, ``backends.inflight``;
           ``policies.route.pooled_arrivals``: the requests to come are the router's to place).
           Issue #45: without it, an agent's turn re-prefilling 30k tokens on vLLM (5 s) held
           every one-shot behind it, and a one-off took a llama.cpp slot for a slow answer while
           later ones queued; with it, contention-4's mean TTFT fell 10% over 32 draws, 2.027 ->
           1.818 s. Each replica's own rate (a few requests in 30 s on a large fleet) was noise
           that sent long prompts behind an 18 s queue where an 8 s one was free, for a replica
           that had seen fewer requests lately. Counting half the hold for those arriving during
           it (their mean wait) was tried: contention-4 to -8 2-4% slower and mixed's seed 7 1.11x
           the best peer: the requests a hold delays delay the next ones in turn, which the whole
           hold stands for (docs/benchmarks.md, 2026-12-05)
"""

from __future__ import annotations

import enum

from policies.slots import SlotOption, proven
from policies.types import BackendSnapshot, EngineKind, RequestFeatures, SessionView

OTHERS_SHARE = 0.5
"""Of the requests arriving while a request holds an engine's prompt processing (vLLM) or a slot
(llama.cpp, a one-off), the share taken to wait for it: the rest go elsewhere (the routing benchmark:
0.25 and 0.5 did alike on the contention rows; 1 hurt every row)."""


class Seat(enum.Enum):
    """Whose llama.cpp slot a request takes, for what it costs the requests that come next."""

    ONE_OFF = "one-off"  # a request no session is proven to follow: it holds the slot for its run
    SESSION = "session"  # a session's turn on the backend holding its state: the slot is the session's
    MOVED = "moved"  # a session's turn leaving another llama.cpp backend that holds its state


def others_s(snapshot: BackendSnapshot, prefill: float, queue: float, run: float, seat: Seat) -> float:
    """What sending the request here is expected to add to the requests that come next (module
    docstring): on vLLM its prefill, to each arriving while it waits and prefills; on a llama.cpp slot
    a one-off's whole run, to each arriving for that slot meanwhile; a session's turn on the backend
    holding its state nothing; a session's turn moved from another llama.cpp backend its prefill, as
    on vLLM: it re-prefills there a conversation another engine holds, in the steps every slot of
    the engine shares."""
    rate = snapshot.arrivals_per_s
    if snapshot.kind is EngineKind.LLAMACPP:
        if seat is Seat.SESSION:
            return 0.0
        if seat is Seat.ONE_OFF:
            return held_s(rate / max(snapshot.total_slots or 1, 1), queue, run)
    return held_s(rate, queue, prefill)


def held_s(rate: float, queue: float, hold: float) -> float:
    """What holding an engine (or a slot) for ``hold`` seconds after ``queue`` costs the requests
    arriving there at ``rate`` meanwhile: OTHERS_SHARE of them wait for it (module docstring)."""
    return OTHERS_SHARE * rate * hold * (queue + hold)


def seat_of(
    features: RequestFeatures, session: SessionView | None, option: SlotOption, snapshot: BackendSnapshot
) -> Seat:
    """Whose llama.cpp slot the request runs on, for ``others_s``."""
    if not (proven(features, session) or option.mine):
        return Seat.ONE_OFF
    if session is not None and session.slot is not None and session.backend_id != snapshot.backend_id:
        return Seat.MOVED
    return Seat.SESSION
