"""Synthetic workloads (``turnout trace agent|chat|mixed``), deterministic from a seed.

Block ids are drawn from one counter per trace, so unrelated text never shares an id.

* **agent**: ``agents`` coding agents, each ``turns`` sequential turns in one session. Every agent starts
  with the same ``SYSTEM_BLOCKS`` (tool definitions) and its own task; each turn resends the whole
  conversation plus new blocks (the last answer, tool output, user text). Context grows from
  ``start_tokens`` to exactly ``max_context``: turn ``k`` adds ``g_k = (max - start) * w_k / sum(w)``
  tokens, ``w_k = U(0.5, 1.5)``. Arrivals: agent ``a`` starts at
  ``U(0, stagger)``; turn ``k+1`` arrives ``U(1, 4)`` s after turn ``k`` (the runner also waits for the
  previous turn to end). Answers: ``U(64, 256)`` tokens.
* **chat**: ``requests`` independent one-shot requests (no session), Poisson arrivals over
  ``duration`` seconds; each prompt is the shared ``SYSTEM_BLOCKS`` plus ``U(1, 6)`` blocks of its own
  (the last one partial), answers ``U(32, 320)`` tokens.
* **mixed**: an agent trace and a chat trace over the same time span, merged by arrival.
* **contention**: ``agents`` concurrent agents (more than the llama.cpp slots), each ``turns`` turns
  over a shared ``system_tokens`` system prompt, adding ``U(1.2k, 3.8k)`` tokens a turn with answers of
  ``U(80, 400)`` tokens, turns ``U(1, 4)`` s apart, agents starting within ``stagger`` s; plus one-shot
  requests of ``U(1.5k, 9k)`` tokens of their own text arriving every ``oneshot_every`` s on average
  (Poisson) over the agents' span.
"""

from __future__ import annotations

import itertools
import random
from collections.abc import Iterator
from dataclasses import dataclass, replace

from gateway.replay.traces import BLOCK_TOKENS, TraceRequest

SYSTEM_BLOCKS = 4
"""Blocks of system prompt + tool definitions every generated request starts with (ids 0..3)."""


@dataclass
class _Ids:
    """Allocates fresh block ids after the shared system blocks."""

    counter: Iterator[int]

    @classmethod
    def fresh(cls, start: int = SYSTEM_BLOCKS) -> _Ids:
        return cls(itertools.count(start))

    def take(self, n: int) -> list[int]:
        return [next(self.counter) for _ in range(n)]


def _blocks(tokens: int) -> int:
    return -(-tokens // BLOCK_TOKENS)


def _turn(
    stream: list[int], ids: _Ids, t: float, session: str, model: str, size: int, max_tokens: int
) -> TraceRequest:
    """An agent session's next turn of ``size`` tokens: ``stream`` (its block ids) grows to cover it."""
    stream += ids.take(_blocks(size) - len(stream))
    return TraceRequest(
        t=round(t, 3),
        session=session,
        model=model,
        input_tokens=size,
        hash_ids=tuple(stream[: _blocks(size)]),
        max_tokens=max_tokens,
        agent=True,
    )


def _one_off(ids: _Ids, t: float, model: str, size: int, max_tokens: int) -> TraceRequest:
    """A request of ``size`` tokens of its own text, in no session."""
    return TraceRequest(
        t=round(t, 3),
        session=None,
        model=model,
        input_tokens=size,
        hash_ids=tuple(ids.take(_blocks(size))),
        max_tokens=max_tokens,
    )


def agent_trace(
    *,
    agents: int = 4,
    turns: int = 24,
    seed: int = 0,
    model: str = "replay",
    start_tokens: int = 4000,
    max_context: int = 60000,
    stagger: float = 10.0,
    ids: _Ids | None = None,
) -> list[TraceRequest]:
    """The agent workload (module docstring), sorted by arrival."""
    rng = random.Random(f"agent-{seed}")
    ids = ids or _Ids.fresh()
    out: list[TraceRequest] = []
    for agent in range(agents):
        stream = list(range(SYSTEM_BLOCKS))  # this session's block ids, extended as it grows
        t = rng.uniform(0.0, stagger)
        weights = [rng.uniform(0.5, 1.5) for _ in range(turns - 1)]
        total = sum(weights)
        for turn in range(turns):
            size = start_tokens + round((max_context - start_tokens) * sum(weights[:turn]) / (total or 1))
            if turn:
                t += rng.uniform(1.0, 4.0)
            out.append(_turn(stream, ids, t, f"agent-{seed}-{agent}", model, size, rng.randint(64, 256)))
    return sorted(out, key=lambda r: r.t)


def chat_trace(
    *,
    requests: int = 200,
    duration: float = 60.0,
    seed: int = 0,
    model: str = "replay",
    ids: _Ids | None = None,
) -> list[TraceRequest]:
    """The chat workload (module docstring), sorted by arrival."""
    rng = random.Random(f"chat-{seed}")
    ids = ids or _Ids.fresh()
    rate = requests / duration if duration > 0 else float("inf")
    t = 0.0
    out: list[TraceRequest] = []
    for _ in range(requests):
        t += rng.expovariate(rate) if rate != float("inf") else 0.0
        own = rng.randint(1, 6)
        tokens = SYSTEM_BLOCKS * BLOCK_TOKENS + (own - 1) * BLOCK_TOKENS + rng.randint(16, BLOCK_TOKENS)
        out.append(
            TraceRequest(
                t=round(min(t, duration), 3),
                session=None,
                model=model,
                input_tokens=tokens,
                hash_ids=(*range(SYSTEM_BLOCKS), *ids.take(own)),
                max_tokens=rng.randint(32, 320),
            )
        )
    return out


def mixed_trace(
    *,
    agents: int = 2,
    turns: int = 16,
    requests: int = 150,
    duration: float = 60.0,
    seed: int = 0,
    model: str = "replay",
    max_context: int = 60000,
) -> list[TraceRequest]:
    """Agents and chat traffic together (module docstring), sorted by arrival."""
    ids = _Ids.fresh()
    agent = agent_trace(
        agents=agents,
        turns=turns,
        seed=seed,
        model=model,
        max_context=max_context,
        stagger=duration / 4,
        ids=ids,
    )
    chat = chat_trace(requests=requests, duration=duration, seed=seed, model=model, ids=ids)
    return sorted([*agent, *chat], key=lambda r: r.t)


def contention_trace(
    *,
    agents: int = 6,
    turns: int = 12,
    seed: int = 0,
    model: str = "replay",
    system_tokens: int = 6000,
    oneshot_every: float = 7.0,
    stagger: float = 10.0,
) -> list[TraceRequest]:
    """The contention workload (module docstring), sorted by arrival."""
    rng = random.Random(f"contention-{seed}")
    ids = _Ids.fresh(_blocks(system_tokens))
    system = list(range(_blocks(system_tokens)))
    out: list[TraceRequest] = []
    end = 0.0
    for agent in range(agents):
        stream = list(system)
        size = system_tokens
        t = rng.uniform(0.0, stagger)
        for _ in range(turns):
            size += rng.randint(1200, 3800)
            out.append(_turn(stream, ids, t, f"agent-{seed}-{agent}", model, size, rng.randint(80, 400)))
            t += rng.uniform(1.0, 4.0)
        end = max(end, t)
    t = rng.expovariate(1 / oneshot_every) if oneshot_every > 0 else end
    while t < end:
        out.append(_one_off(ids, t, model, rng.randint(1500, 9000), rng.randint(80, 400)))
        t += rng.expovariate(1 / oneshot_every)
    return sorted(out, key=lambda r: r.t)


def without_sessions(requests: list[TraceRequest]) -> list[TraceRequest]:
    """The same trace as Mooncake would have it: no session ids (prefixes shared only by content)."""
    return [replace(r, session=None) for r in requests]
