"""The turns other sessions will send while an answer decodes, and what their prompts cost it.

Both engines run every running request's next token and the prompt chunks of new requests in the
same steps (vLLM's chunked prefill, llama-server's batch over its slots), so a prompt that arrives
while an answer decodes stalls that answer for about its own prefill. On a server agents share, the
next turn of another agent at home there is such a prompt, and it comes soon: its client sends it
as soon as its tool calls return. The cost model priced only the batch running when it decided,
so an agent's time to the last token came out short where other agents live: on the benchmark's
agent row, 0.335 s short on average with both agents on the llama-server's two slots (issue #61).

``gateway.live.Homes`` tells, for each session at home on a backend, when its turn in flight ends
(or ended), its think time (a turn's end to its next turn, a moving average) and how many tokens its
turns add (its growth): a ``NextTurn``. Each is expected to arrive ``think_s`` after it is ready, by
an exponential wait of that mean (memoryless: a session silent for a while is as likely to come in
the next second as it was at first), so the chance it arrives while this answer decodes, between
``start`` and ``end``, is

    p = exp(-(start - ready) / think) - exp(-(end - ready) / think)     ready = max(ready_at, now)

and the answer is expected to wait ``stall = sum(p * prefill of its growth after what it holds)``,
priced by the candidate's profile and learned rates (``policies.pricing.prefill_s``). A llama-server
runs at most one prompt a slot: beside this answer, its other slots' worth (``room``); where the
chances sum to more, the stall is scaled to that many (the rest queue for a slot: they delay their
own turns, not this answer). With 8 agents at home on 2 slots, counting every one of them sent the
agents of the contention rows off the llama-server's warm slots to re-prefill on vLLM. Learning takes
the predicted stall out of a measured decode before it learns a rate from it (``policies.learning``),
so the rate stays the engine's and the stall is not counted twice.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

import msgspec

from policies.learning import DeploymentStats
from policies.pricing import prefill_s
from policies.types import Deployment


class NextTurn(msgspec.Struct, frozen=True):
    """Another session's next turn, expected on the backend it is at home on (module docstring)."""

    ready_at: float
    """When its turn in flight is expected to end, or when its last one ended: its think time starts."""
    think_s: float
    """The mean time from one of its turns' end to its next turn (0: it comes the moment it is ready)."""
    tokens: int
    """The prompt tokens its next turn is expected to add (its mean growth a turn)."""
    cached: int
    """What that turn finds reused there: its last prompt's tokens."""


def arrival_chance(turn: NextTurn, start: float, end: float, now: float) -> float:
    """The chance ``turn`` arrives between ``start`` and ``end`` (module docstring), given it has not
    arrived by ``now``."""
    if end <= start:
        return 0.0
    ready = max(turn.ready_at, now)
    if end <= ready:
        return 0.0
    if turn.think_s <= 0.0:
        return 1.0 if start <= ready else 0.0
    early = max(start - ready, 0.0) / turn.think_s
    late = (end - ready) / turn.think_s
    return math.exp(-early) - math.exp(-late)


def stall_s(
    turns: Sequence[NextTurn],
    deployment: Deployment,
    stats: DeploymentStats,
    start: float,
    end: float,
    now: float,
    room: int | None = None,
    share: float = 1.0,
) -> float:
    """Seconds an answer decoding from ``start`` to ``end`` on ``deployment`` is expected to wait for
    the prompts of ``turns`` (module docstring); ``room``: how many of them can run beside it at
    once (llama.cpp: its other slots; None: any number, vLLM's batch)."""
    total = mass = 0.0
    for turn in turns:
        chance = arrival_chance(turn, start, end, now) * share
        if chance > 0.0:
            mass += chance
            total += chance * prefill_s(deployment, stats, turn.tokens, turn.cached)
    if room is not None and mass > room:
        total *= room / mass  # the rest wait for a slot: they queue, they do not stall it
    return total
