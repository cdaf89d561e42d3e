"""The decision log's view of a routed request: one entry per request (``decision_entry``), how a
session is named to the operator (``session_shown``), and a conversation that had to leave its
backend (``moved``)."""

from __future__ import annotations

from typing import Any

from gateway.routed import Routed
from policies.decision import Outcome, WarmUp
from policies.sessions import session_label
from policies.types import Awaited, Endpoint, Reason

MOVES = {
    Reason.CONTEXT_TOO_LONG: "it outgrew that backend's window",
    Reason.UNHEALTHY: "that backend is down",
    Reason.CIRCUIT_OPEN: "that backend's circuit is open",
    Reason.DRAINED: "an admin drained that backend",
    Reason.ASLEEP: "another member of its residency set holds the GPUs",
    Reason.PINNED: "an admin pinned its model group to another member",
}
"""Why a conversation must leave the backend it was on (the rejection of that backend), in words."""


def moved(routed: Routed) -> dict[str, Any] | None:
    """A session that had to leave its backend (``MOVES``): where from, where to, why, the models when
    it changes model (a group's member), and what the move costs (the prompt tokens re-prefilled there
    and their seconds). A conversation the cost model sends elsewhere by choice is not a move."""
    decision, session = routed.decision, routed.session
    chosen = decision.chosen_candidate
    if session is None or session.backend_id is None or chosen is None:
        return None
    previous = session.backend_id
    if previous == chosen.deployment.backend_id:
        return None
    reasons = [r.reason for r in decision.rejected if r.backend_id == previous and r.reason in MOVES]
    why = Reason.CONTEXT_TOO_LONG if previous in routed.overflowed else next(iter(reasons), None)
    if why is None:
        return None
    estimate = chosen.estimate
    cached = estimate.expected_cached_tokens if estimate else 0
    moves_model = session.model is not None and session.model != chosen.deployment.model
    return {
        "from": previous,
        "to": chosen.deployment.backend_id,
        "reason": why.value,
        **({"from_model": session.model, "to_model": chosen.deployment.model} if moves_model else {}),
        "prompt_tokens": routed.features.prompt_tokens,
        "reprefill_tokens": max(routed.features.prompt_tokens - cached, 0),
        "prefill_s": round(estimate.prefill_s, 4) if estimate else None,
    }


NAMED_SOURCES = ("h:", "a:", "k:", "u:", "m:")
"""Session keys that carry the client's own name after their source (``policies.sessions``): the
``x-session-id`` header, an agent's header, ``prompt_cache_key``, ``user``, Anthropic's
``metadata.user_id``. A conversation known only by its content has no name."""


def session_name(key: str | None, *, redact: bool = False) -> str | None:
    """The name the client gave its session (``agent-7`` for ``x-session-id: agent-7``); None for an
    implicit session, or when names are redacted (``admin.redact_session_ids``)."""
    if key is None or redact or not key.startswith(NAMED_SOURCES):
        return None
    return key[2:]


def session_shown(key: str, *, redact: bool = False) -> str:
    """How the operator is shown a session, everywhere: the name its client gave it, else (known by
    its content, or names redacted) its label."""
    return session_name(key, redact=redact) or session_label(key)


def _shown_in(text: str, evicts: str | None, redact: bool) -> str:
    """An explanation (``policies``' notes name a session by its label: it reaches the client in
    ``x-turnout-route-reason``) as the operator reads it: the evicted session as it is shown."""
    if evicts is None:
        return text
    return text.replace(f"session {session_label(evicts)}", f"session {session_shown(evicts, redact=redact)}")


def _warm_up(warm: WarmUp | None) -> dict[str, Any] | None:
    """A background warm-up as the decision log shows it (``policies.warm``)."""
    if warm is None:
        return None
    return {
        "backend": warm.backend_id,
        "slot": warm.slot,
        "ready_s": round(warm.ready_s, 4),
        "delay_s": round(warm.delay_s, 4),
        "cost_s": round(warm.cost_s, 4),
    }


TIMED = ("predicted_ttft_s", "predicted_total_s")
"""Predictions of a first and a last token: a token count (``/v1/messages/count_tokens``) has neither
(it was shown as a 9.3 s predicted TTFT, its routing's prefill price)."""


def _for_endpoint(endpoint: Endpoint, candidate: dict[str, Any]) -> dict[str, Any]:
    if endpoint is Endpoint.COUNT_TOKENS:
        return {k: v for k, v in candidate.items() if k not in TIMED}
    return candidate


def decision_entry(
    routed: Routed,
    request_id: str,
    outcome: Outcome | None,
    status: int,
    error: str | None = None,
    *,
    at: float,
    redact: bool = False,
) -> dict[str, Any]:
    """One decision log entry: the choice, every candidate's prediction, and what really happened
    (``status``/``error``: how the request ended, also when no outcome was measured; ``at``: when,
    epoch seconds; ``redact``: leave out the name the client gave its session)."""
    decision, features = routed.decision, routed.features
    chosen = decision.chosen_candidate
    evicted = chosen.estimate.evicts if chosen is not None and chosen.estimate is not None else None
    return {
        "at": at,
        "request_id": request_id,
        "model": features.model,
        "endpoint": features.endpoint.value,
        "profile": decision.profile,
        "session": session_label(features.session_key) if features.session_key else None,
        "session_name": session_name(features.session_key, redact=redact),
        "session_source": features.session_source.value,
        "prompt_tokens_estimate": features.prompt_tokens,
        "prompt_tokens_exact": features.prompt_exact,
        "prompt_tokens_counted": features.prompt_counted,
        "chosen": decision.chosen.backend_id if decision.chosen else None,
        "chosen_model": decision.chosen.model if decision.chosen else None,
        "slot": decision.slot,
        "warm_up": _warm_up(routed.warm),
        "reason": _shown_in(decision.header, evicted, redact),
        "follow_up_rate": round(decision.follow_rate, 3) if decision.follow_rate is not None else None,
        "objective": decision.objective or None,
        "objective_why": decision.objective_why or None,
        "candidates": [
            _for_endpoint(
                features.endpoint,
                {
                    "backend": c.deployment.backend_id,
                    "model": c.deployment.model,
                    "score": round(c.score, 4),
                    "components": dict(c.components),
                    **(
                        {
                            "expected_cached_tokens": c.estimate.expected_cached_tokens,
                            "predicted_ttft_s": round(c.estimate.ttft_s, 4),
                            "predicted_total_s": round(c.estimate.total_s, 4),
                            "next_turn_s": round(c.estimate.future_s, 4),
                            "look_ahead_turns": round(c.estimate.horizon, 3),
                            "objective_s": round(
                                c.estimate.objective_total_s
                                if decision.objective == Awaited.LAST_TOKEN.value
                                else c.estimate.objective_ttft_s,
                                4,
                            ),
                            "queue_s": round(c.estimate.queue_s, 4),
                            "ram_saves_s": round(c.estimate.saves_s, 4),
                            "checkpoint_restore_s": round(c.estimate.checkpoint_s, 4),
                            "slot": c.estimate.slot,
                            "warm": c.estimate.warm,
                            "cache_source": c.estimate.source,
                            "evicts": session_label(c.estimate.evicts) if c.estimate.evicts else None,
                            "evicts_name": session_name(c.estimate.evicts, redact=redact),
                            "evict_cost_s": round(c.estimate.evict_cost_s, 4),
                            "others_s": round(c.estimate.others_s, 4),
                            "stall_s": round(c.estimate.stall_s, 4),
                            "warm_up": _warm_up(c.estimate.warm_up),
                            "note": _shown_in(c.estimate.note, c.estimate.evicts, redact),
                        }
                        if c.estimate
                        else {}
                    ),
                },
            )
            for c in decision.candidates
        ],
        "rejected": [
            {"backend": r.backend_id, "reason": r.reason.value, "detail": r.detail} for r in decision.rejected
        ]
        + [
            {"backend": b, "reason": "context-too-long", "detail": "the engine refused it as too long"}
            for b in routed.overflowed
        ],
        "moved": moved(routed),
        "status": status,
        "error": error,
        "outcome": None
        if outcome is None
        else {
            "status": status,
            "ttft_s": outcome.ttft_s,
            "duration_s": round(outcome.duration_s, 4),
            "prompt_tokens": outcome.usage.prompt_tokens,
            "cached_tokens": outcome.usage.cached_tokens,
            "completion_tokens": outcome.usage.completion_tokens,
        },
    }
