"""One request turnout has in flight, with what routing predicted for it (``Sent``), and when a
llama.cpp slot running a chain of them is predicted free (``busy_until``): the per-request
predictions the in-flight overlay (``backends.inflight``) lays over the probes' snapshots, and that
the gateway builds from a decision (``gateway.lifecycle.in_flight``, ``gateway.warming``).
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Sequence

import msgspec

OVERDUE_FLOOR = 0.3


class Sent(msgspec.Struct, frozen=True):
    """One request in flight, with what routing predicted for it (seconds)."""

    backend_id: str
    slot: int | None
    started: float
    total_s: float = 0.0
    queue_s: float = 0.0
    deferred_s: float = 0.0
    """The part of ``queue_s`` it waits deferred for a llama.cpp slot busy with work not of turnout's
    (not in the engine till then); behind turnout's own request on its slot it waits till that ends."""
    prefill_s: float = 0.0
    interleaved_s: float = 0.0
    prompt_tokens: int = 0
    """Its prompt's tokens (the estimate), for the router's own count of what it sent (``own``)."""
    holds: bool = True
    """An inference request, which holds the engine's prompt processing or a slot while it runs (a
    token count does not: it is not an arrival in ``arrivals_per_s``)."""
    warm: bool = False
    """A background warm-up of a llama.cpp slot (``gateway.warming``): no client waits for it."""
    stream: bool = False
    """Streamed: its first token is seen when it comes (``InFlight.prefilled``), so until then its
    prompt is known unprocessed, however long ago its prediction said it would be (``seen_left_s``)."""

    def prefill_left_s(self, now: float) -> float:
        """Seconds of prompt processing still to do: ``prefill_s``, worked off over its predicted
        span (the decode steps interleaved with its chunks stretch it)."""
        done = max(now - self.started - self.queue_s, 0.0) / self.prefill_span_s if self.prefill_s else 1.0
        return self.prefill_s * max(1.0 - done, 0.0)

    def deferred_at(self, now: float) -> bool:
        """Whether it is still predicted deferred for a slot busy with others' work at ``now``."""
        return now < self.started + self.deferred_s

    @property
    def prefill_span_s(self) -> float:
        """How long its prompt is predicted to take once it starts: the prefill and the decode steps
        of other requests run in the same engine steps."""
        return self.prefill_s + self.interleaved_s

    @property
    def run_s(self) -> float:
        """How long it is predicted to run once it has the slot: its predicted total less its
        predicted wait (the wait for the requests ahead of it is the chain's, ``busy_until``)."""
        return max(self.total_s - self.queue_s, 0.0)

    @property
    def prefilled_by(self) -> float:
        """When its prompt is predicted processed: no backlog left from then on."""
        return self.started + self.queue_s + self.prefill_span_s


def seen_left_s(watched: Sequence[Sent], since: float, now: float) -> float:
    """Seconds of prompt processing the streamed requests in an engine without a first token
    (``watched``, in the order sent) still need, as observed: the engine works prompts in the order
    they came, and it has worked on these since the oldest was sent or the first token of the
    streamed prompt before them came (``since``), whichever is later; their predicted spans less
    that time, but at least ``OVERDUE_FLOOR`` of the oldest one's (it has no first token yet), in
    prefill seconds.

    Each request's predicted queue and span (``Sent.prefill_left_s``) are worked off on the clock
    whatever the engine does: on a saturated vLLM they ran out while the prompts still waited
    (val-mooncake-synthetic: 150k tokens of prompts without a first token, ~25 s of work, read as
    0-2 s), and every later request was sent into a queue predicted empty."""
    if not watched:
        return 0.0
    head = watched[0]
    work = sum(request.prefill_s for request in watched)
    span = work + max(request.interleaved_s for request in watched)
    if span <= 0:
        return 0.0
    left = max(span - max(now - max(head.started, since), 0.0), OVERDUE_FLOOR * head.prefill_span_s)
    return left * work / span


def busy_until(requests: Iterable[Sent], now: float) -> float:
    """When a slot running ``requests`` (pinned there, in the order sent) is predicted free: each
    starts when it was sent or when the one before it ends, whichever is later, and runs for its
    predicted total less its predicted wait (``Sent.run_s``: that wait is this chain); a request past
    its predicted end is still running, ``OVERDUE_FLOOR`` of its run more (``backends.inflight``'
    module docstring). ``now`` or later."""
    end = -math.inf
    for request in requests:
        start = max(request.started, end)
        run = request.run_s
        end = max(start + run, now + OVERDUE_FLOOR * run)
    return max(end, now)
