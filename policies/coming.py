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
an exponential wait of that mean from when it was ready, so the chance it arrives while this answer
decodes, between ``start`` and ``end``, is

    p = exp(-max(start - ready, 0) / think) - exp(-(end - ready) / think)     (0 when end <= ready)

and the answer is expected to wait ``stall = sum(p * prefill of its growth after what it holds)``,
priced by the candidate's profile and learned rates (``policies.pricing.prefill_s``).

``p`` is not the chance given the turn has not come yet: a session silent for several of its think
times is ever less likely to send at once (its agent may be done; ``Homes`` drops it after
``ACTIVE_S``). Taken as memoryless, a session whose turns had come milliseconds apart was priced as
about to send for the 10 s it stayed at home, and a 4-token answer on the llama-server it had used
"waited" 0.7 s for it (tests/e2e/test_groups.py caught it).

A llama-server
runs at most one prompt a slot: beside this answer, its other slots' worth (``room``); where the
chances sum to more, the stall is scaled to that many (the rest queue for a slot: they delay their
own turns, not this answer). With 8 agents at home on 2 slots, counting every one of them sent the
agents of the contention rows off the llama-server's warm slots to re-prefill on vLLM. Learning takes
the predicted stall out of a measured decode before it learns a rate from it, whole
(``policies.learning._stalled`` says why), so the stall is not counted twice.
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


def arrival_chance(turn: NextTurn, start: float, end: float) -> float:
    """The chance ``turn`` arrives between ``start`` and ``end`` (module docstring)."""
    ready = turn.ready_at
    if end <= start or end <= ready:
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
    room: int | None = None,
    share: float = 1.0,
) -> float:
    """Seconds an answer decoding from ``start`` to ``end`` on ``deployment`` is expected to wait for
    the prompts of ``turns`` (module docstring); ``room``: how many of them can run beside it at
    once (llama.cpp: its other slots; None: any number, vLLM's batch)."""
    total = mass = 0.0
    for turn in turns:
        chance = arrival_chance(turn, start, end) * share
        if chance > 0.0:
            mass += chance
            total += chance * prefill_s(deployment, stats, turn.tokens, turn.cached)
    if room is not None and mass > room:
        total *= room / mass  # the rest wait for a slot: they queue, they do not stall it
    return total
