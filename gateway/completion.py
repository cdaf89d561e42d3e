"""A routed request's end, as one event through a pipeline of small steps (the way structlog's
processors pass one event dict along): ``settle`` stamps a :class:`Completion` on the router's clock,
each step reads what it needs and adds what it makes, and the last one writes the store in one batch.

The steps, in order (``STEPS``):

1. ``log_entry``: the decision log entry (every routed request, answered or not);
2. ``record_traffic``: a trace line, when ``[record]`` is on and the request was answered;
3. ``timeline``: the session's timeline entry, at the prefill rate believed when it was routed;
4. ``learning``: the outcome goes to learning (``Router.absorb``);
5. ``next_session``: the session's next state and what the engine now holds (``SentPrompt``);
6. ``turn_ended``: the session stays at home on its backend a little longer (``gateway.live.Homes``);
7. ``write`` (always last): the prefix index record, the session, its timeline and the decision
   log entry, one batch (``StateStore.finish_turn``); a request with no outcome writes its entry only.

The relay (``gateway.lifecycle``) and the virtual replay settle through the same pipeline. The request's
log line and metrics are the front end's (every request has one, routed or not: ``RequestRecord``).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

from gateway.decisions import decision_entry
from gateway.routed import Routed
from gateway.routing import Router
from gateway.state import SentPrompt
from gateway.timeline import turn_record
from policies.decision import Outcome, ScoredCandidate
from policies.slot_rules import checkpoint_gap
from policies.types import Awaited, Endpoint, EngineKind, SessionView, Usage


@dataclass(slots=True)
class Completion:
    """One routed request's end: how it ended, what was measured, and what the steps make of it."""

    routed: Routed
    request_id: str
    status: int
    error: str | None = None
    outcome: Outcome | None = None
    """What the engine really did (None: no answer to learn from: refused, failed or cut short)."""
    at: float = 0.0
    """When it ended, epoch seconds on the router's clock (``settle`` sets it)."""
    entry: dict[str, Any] = field(default_factory=dict)
    turn: dict[str, Any] | None = None
    session: SessionView | None = None
    sent: SentPrompt | None = None

    @property
    def chosen(self) -> ScoredCandidate | None:
        """The candidate it was sent to, when it has an outcome to learn from."""
        return self.routed.decision.chosen_candidate if self.outcome is not None else None


Step = Callable[[Router, Completion], None]


def log_entry(router: Router, done: Completion) -> None:
    done.entry = decision_entry(
        done.routed,
        done.request_id,
        done.outcome,
        done.status,
        done.error,
        at=done.at,
        redact=router.redact_session_ids,
    )


def record_traffic(router: Router, done: Completion) -> None:
    if router.recorder is not None and done.chosen is not None and done.outcome and done.status < 400:
        router.recorder.record(done.routed.features, done.outcome, done.entry["session"], at=done.at)


def timeline(router: Router, done: Completion) -> None:
    chosen, outcome = done.chosen, done.outcome
    if chosen is None or outcome is None or done.routed.session is None:
        return
    rate = router.learned.for_deployment(chosen.deployment, outcome.kind).prefill_tok_s.value
    done.turn = turn_record(done.routed, outcome, done.request_id, rate, at=done.at)


def learning(router: Router, done: Completion) -> None:
    if done.chosen is not None and done.outcome is not None:
        router.absorb(done.outcome, done.chosen.deployment)


def next_session(router: Router, done: Completion) -> None:
    chosen, outcome = done.chosen, done.outcome
    if chosen is None or outcome is None:
        return
    routed, usage = done.routed, outcome.usage
    session, chain, slot = routed.session, routed.features.chain, routed.decision.slot
    if chain.length:
        key = session.key if session is not None else None
        tokens, cached = usage.prompt_tokens, usage.cached_tokens
        features = routed.features
        user, first = features.user_start_at(tokens), features.first_user_start_at(tokens)
        gap = checkpoint_gap(chosen.deployment)
        done.sent = SentPrompt(
            outcome.backend_id, slot, chain, tokens, key, cached, user, gap, first, features.head
        )
    if session is None:
        return
    cached = usage.cached_tokens or 0
    rate = router.learned.for_deployment(chosen.deployment, outcome.kind).prefill_tok_s.value
    done.session = SessionView(
        key=session.key,
        backend_id=outcome.backend_id,
        slot=slot,
        prompt_tokens=usage.prompt_tokens,
        cached_tokens=cached,
        turns=session.turns + 1,
        last_seen=done.at,
        prompt=chain.mark if chain.length else None,
        shape=routed.features.shape,
        source=routed.features.session_source.value,
        first_seen=session.first_seen or done.at,
        total_prompt_tokens=session.total_prompt_tokens + usage.prompt_tokens,
        total_cached_tokens=session.total_cached_tokens + cached,
        saved_s=session.saved_s + (cached / rate if rate > 0 else 0.0),
        model=chosen.deployment.model,
        agent=session.agent or routed.features.awaited is Awaited.LAST_TOKEN,
        answer_tokens=_answers(session.answer_tokens, usage.completion_tokens),
    )


ANSWER_WEIGHT = 0.3
"""How much a session's newest answer moves what its next one is expected to be."""


def _answers(average: float, tokens: int) -> float:
    """A session's answer tokens after one more answer: its moving average (the first: the answer)."""
    if tokens <= 0:
        return average
    return float(tokens) if average <= 0 else average + ANSWER_WEIGHT * (tokens - average)


def turn_ended(router: Router, done: Completion) -> None:
    session = done.routed.session
    if session is not None and done.routed.features.endpoint is not Endpoint.COUNT_TOKENS:
        router.homes.ended(session.key, done.at)


STEPS: tuple[Step, ...] = (log_entry, record_traffic, timeline, learning, next_session, turn_ended)


async def write(router: Router, done: Completion) -> None:
    """The store's writes for ``done``, in one batch (the decision log entry alone without an outcome)."""
    if done.chosen is None:
        await router.store.record_decision(done.entry)
        return
    if done.sent is not None:
        await router.store.record_prompt(done.sent)
    await router.store.finish_turn(done.session, done.turn, done.entry)


async def settle(router: Router, done: Completion, steps: Sequence[Step] = STEPS) -> Completion:
    """Run ``done`` through ``steps`` then ``write``, stamped now on the router's clock."""
    done.at = router.clock.time()
    for step in steps:
        step(router, done)
    await write(router, done)
    return done


def measured(
    routed: Routed,
    kind: EngineKind,
    usage: Usage,
    *,
    ttft_s: float | None,
    duration_s: float,
    stream: bool,
    shared: bool = False,
) -> Outcome:
    """What a request routed along ``routed`` really did, for learning (its chosen candidate's
    prediction beside it); ``shared``: a background warm-up's prompt processing overlapped its own
    (``backends.fleet.Fleet.end``)."""
    chosen = routed.decision.chosen_candidate
    assert chosen is not None
    estimate = chosen.estimate
    return Outcome(
        backend_id=chosen.deployment.backend_id,
        model=chosen.deployment.model,
        kind=kind,
        usage=usage,
        ttft_s=ttft_s,
        duration_s=duration_s,
        prompt_chars=routed.features.prompt_chars,
        shared_prefix_tokens=estimate.shared_prefix_tokens if estimate else 0,
        stream=stream,
        contended=estimate.contended if estimate else False,
        shared_prefill=shared,
        predicted=estimate,
        client=routed.features.client,
        user_start=routed.features.user_start,
        first_user=routed.features.first_user_start,
    )
