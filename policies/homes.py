"""Crowded llama-servers: more active sessions at home there than slots.

A session is at home on the backend its last turn went to while that turn runs and for seconds after
(``RoutingContext.homes``, counted by ``gateway.live.Homes``). Agents send their next turn the moment
a tool call returns, so a llama-server's load is its sessions, not the queue of the moment: with four
agents on two slots, every slot that frees has a turn of another session waiting for it.

On a crowded llama-server (``crowded``) two rules hold, both issue #45's (contention-32-8llama: 32
agents on 8 llama-servers of 2 slots):

- **Its turns share its slots** (``policies.slots``): a turn that would wait names no slot and
  takes the first one to free, restoring its conversation from the RAM prompt cache; only an idle
  slot is named (the turn starts now). A slot can hold one conversation of the two or more that use
  it in turn, so waiting for a named one buys a specific queue and little reuse; and llama-server
  hands a freed slot to the tasks pinned to it before any other, so pinned waits beside unpinned ones
  starve the latter. Named slots on every llama-server: mean TTFT 8.171 s, p90 16.131 s (dynamo-kv,
  which names none: 8.343 / 15.778).
- **Its sessions stay** (``stays_home``): a session at home there is not moved to another
  llama-server unless that one carries fewer sessions a slot even after it moves (the move evens
  the load). A move for a queue that is shorter at the moment re-prefills the conversation and takes
  its load along: with turns pooled and sessions free to move, 34% of turns changed server and the
  mean TTFT rose to 11.6 s; with both rules, 7.83 / 15.55 s (docs/benchmarks.md).

Other engines (vLLM) are never dropped: where a session's turn is better re-prefilled on vLLM, the
cost model still says so.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

from policies.context import RoutingContext
from policies.decision import Rejection
from policies.filters import Candidate, FilterResult
from policies.slots import proven, slots_of
from policies.types import BackendSnapshot, EngineKind, Reason, RequestFeatures, SessionView


def at_home(snapshot: BackendSnapshot, homes: Mapping[str, int], session: SessionView | None) -> int:
    """The active sessions at home on ``snapshot``'s backend: ``homes`` counts the others, and
    ``session`` counts when its last turn went there."""
    own = session is not None and session.turns > 0 and session.backend_id == snapshot.backend_id
    return homes.get(snapshot.backend_id, 0) + int(own)


def sharing(snapshot: BackendSnapshot, homes: Mapping[str, int], session: SessionView | None) -> int:
    """The active sessions at home on a crowded llama-server (more than its slots), else 0. A
    newcomer is not at home yet: where the sessions just fill the slots, its first turn may still
    wait for a named one (counted in, contention-32-8llama's mean and p90 were 0.4% higher)."""
    if snapshot.kind is not EngineKind.LLAMACPP:
        return 0
    sessions = at_home(snapshot, homes, session)
    return sessions if sessions > slots_of(snapshot) else 0


def crowded(snapshot: BackendSnapshot, homes: Mapping[str, int], session: SessionView | None) -> bool:
    """A llama-server with more active sessions at home than slots (``sharing``)."""
    return sharing(snapshot, homes, session) > 0


def stays_home(
    features: RequestFeatures, candidates: Sequence[Candidate], context: RoutingContext
) -> FilterResult:
    """A proven session at home on a crowded llama-server keeps it: every other llama-server is
    dropped unless moving there evens the load (after the move it carries no more sessions a slot
    than the home keeps). Off when the home is not a candidate (down, drained, too small a window)."""
    session = context.session
    if session is None or session.turns == 0 or not proven(features, session):
        return list(candidates), []
    home = next(
        (s for _, s in candidates if s.backend_id == session.backend_id and s.kind is EngineKind.LLAMACPP),
        None,
    )
    if home is None or not crowded(home, context.homes, session):
        return list(candidates), []
    stays = at_home(home, context.homes, session)
    left = (stays - 1) / slots_of(home)
    kept: list[Candidate] = []
    dropped: list[Rejection] = []
    for deployment, snapshot in candidates:
        there = context.homes.get(snapshot.backend_id, 0)
        evens = (there + 1) / slots_of(snapshot) <= left
        if snapshot is home or snapshot.kind is not EngineKind.LLAMACPP or evens:
            kept.append((deployment, snapshot))
            continue
        detail = (
            f"the session stays on {home.backend_id} ({stays} sessions for its {slots_of(home)} slots): "
            f"{snapshot.backend_id} has {there} for {slots_of(snapshot)}, moving would not even them"
        )
        dropped.append(Rejection(snapshot.backend_id, Reason.STAYS_HOME, detail))
    return kept, dropped
