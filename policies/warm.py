"""Warming a llama.cpp slot in the background (issue #45): serve this turn where it is fast, and
prefill its prompt into a free llama.cpp slot meanwhile, so the session's next turn finds it warm.

A session's first turn on llama.cpp pays a cold prefill, seconds on a slow-prefill engine, and a
conversation known only by its content pays it on its second turn, once it is proven to continue
(the first went where it was fastest). With a warm-up the turn goes to vLLM (fast prefill) and the
same prompt, capped at one output token, goes to an idle, unleased slot of a llama.cpp candidate; the
next turn then reuses it there. What it costs: the llama.cpp engine's prefill time, which delays
the prompts arriving there meanwhile (priced like vLLM's prefill in ``policies.others.others_s``:
llama-server runs every slot's prompt chunks in the same batches).

For each candidate that is not llama.cpp and expects more turns (``horizon``), the best llama.cpp
candidate (the lowest ``future_s``) on a slot that evicts no one offers

    warm future = that candidate's future_s + late / horizon
    late        = how late the warm-up would be ready (its queue + prefill, past this turn's
                  predicted end there and the session's think time): the next turn waits that
                  long, once; the turns after it find the slot warm
    cost        = OTHERS_SHARE * rate * prefill * (queue + prefill)   (the llama.cpp engine's arrivals,
                  ``policies.others.held_s``)

and the candidate takes it when ``horizon * (future_s - warm future) > cost``: its ``future_s``
becomes the warm future, its ``others_s`` grows by the cost, and ``warm_up`` names the slot. The
scorers then compare it with serving the turn cold on llama.cpp as they compare any candidates.
Only profiles with ``warms`` do this (``cost``, ``cost-completion``); the published routers do not.
"""

from __future__ import annotations

from collections.abc import Sequence

from msgspec.structs import replace

from policies.decision import Estimate, WarmUp
from policies.others import held_s
from policies.types import BackendSnapshot, EngineKind
from policies.views import CandidateView

BACKLOG_EPSILON_S = 1e-6
"""Prompt processing below this is none (the backlog is a sum of floats)."""


def warm_up_cost(view: CandidateView) -> float:
    """What prefilling this candidate's prompt on its llama.cpp engine costs the requests arriving
    there meanwhile (module docstring)."""
    estimate = view.estimate
    rate = view.snapshot.arrivals_per_s
    return held_s(rate, estimate.queue_s, estimate.prefill_s)


def serving_s(snapshot: BackendSnapshot) -> float:
    """The prompt processing a client waits for on ``snapshot``'s engine now: a warm-up is sent
    after it (``WarmUp.delay_s``), so as not to share its batches (``_warmable``)."""
    return max(snapshot.prefill_backlog_s - snapshot.warming_s, 0.0)


def _warmable(view: CandidateView) -> bool:
    """A llama.cpp candidate on an idle slot taken from no session, with no request waiting there.
    A prompt a client waits for being processed there goes first: the warm-up is sent after it
    (``serving_s``), since sharing its batches would slow it and spoil what llama.cpp's timings
    teach (``policies.learning``). Requests decoding there lose a little."""
    estimate, snapshot = view.estimate, view.snapshot
    if snapshot.kind is not EngineKind.LLAMACPP or estimate.slot is None or estimate.evicts is not None:
        return False
    busy = any(state.id == estimate.slot and state.is_processing for state in snapshot.slots)
    return not busy and snapshot.queued == 0


def offer(view: CandidateView, slot_view: CandidateView, think_s: float = 0.0) -> Estimate | None:
    """``view``'s estimate were it to warm ``slot_view``'s slot, or None where that does not pay;
    ``think_s``: how long the session took before this turn (its next comes that long after this
    one ends, as far as anyone knows)."""
    estimate, warm = view.estimate, slot_view.estimate
    if not estimate.horizon:
        return None
    late = max(0.0, warm.ttft_s - estimate.total_s - think_s)
    future = warm.future_s + late / estimate.horizon
    cost = warm_up_cost(slot_view)
    if estimate.horizon * (estimate.future_s - future) <= cost:
        return None
    slot = warm.slot
    assert slot is not None
    return replace(
        estimate,
        future_s=future,
        others_s=estimate.others_s + cost,
        warm_up=WarmUp(
            slot_view.snapshot.backend_id,
            slot,
            warm.ttft_s,
            warm.prefill_s,
            cost,
            warm.expected_cached_tokens,
            delay_s=serving_s(slot_view.snapshot),
        ),
    )


def with_warm_ups(views: Sequence[CandidateView], proven: bool, think_s: float = 0.0) -> list[CandidateView]:
    """``views`` with each candidate that gains by warming a llama.cpp slot (module docstring)
    taking it, for a conversation ``proven`` to continue (``offer``'s ``think_s``)."""
    slots = [v for v in views if _warmable(v)]
    if not slots:
        return list(views)
    best = min(slots, key=lambda v: v.estimate.future_s)
    out: list[CandidateView] = []
    for view in views:
        better = None
        if view.snapshot.kind is not EngineKind.LLAMACPP:
            better = offer(view, best, think_s) if proven else None
        out.append(view if better is None else replace(view, estimate=better))
    return out
