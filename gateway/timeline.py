"""A session's timeline: one record per turn, and why a turn reused less than its previous prompt.

A turn that extends its session's last prompt should find all of it cached (llama.cpp's warm slot:
all but the last checkpoint gap). When it reuses clearly less (``BREAK_MIN_TOKENS`` and
``BREAK_SHARE`` of what it could have), the record says where the prompt broke, from the sessions'
per-message digests (``policies.shape``): which message, the character offset inside it, the likely
cause, and what it cost in re-prefilled tokens and seconds at the learned prefill rate. With no break
in the prompt, the cause is the routing or the engine: a move to another backend, a lost slot, a RAM
cache miss, an engine that kept less than its rules keep. On vLLM a turn that stayed is measured
against what turnout expected it to keep by its rules (whole blocks; nothing of a hybrid model
without prefix caching): that is what the engine does, not a break (every vLLM turn was flagged red).
"""

from __future__ import annotations

from typing import Any

from gateway.decisions import MOVES, moved
from gateway.routed import Routed
from policies.checkpoints import DEFAULT_GAP
from policies.decision import Outcome
from policies.shape import Break, where_it_breaks
from policies.slot_rules import checkpoint_gap
from policies.types import Architecture, EngineKind, Reason

BREAK_MIN_TOKENS = 600
"""Below this a shortfall is a hybrid slot's checkpoint gap (516 tokens at llama-server's default
micro-batch; a hybrid llama.cpp deployment whose profile has a longer one, ``slot_rules.checkpoint_gap``,
adds the difference) or a vLLM block, not a break."""
BREAK_SHARE = 0.1


def _prompt_cause(cut: Break) -> str:
    where = f"message {cut.message} ({cut.role})"
    return {
        "tools-changed": "the tool list changed",
        "dropped": f"{where} was dropped",
        "reasoning-stripped": f"{where} lost its reasoning (a template that strips it from history?)",
        "edited": f"{where} was edited at character ~{cut.offset}",
    }[cut.kind]


def _engine_cause(routed: Routed, outcome: Outcome) -> str:
    session = routed.session
    chosen = routed.decision.chosen_candidate
    estimate = chosen.estimate if chosen else None
    if session is not None and session.backend_id not in (None, outcome.backend_id):
        move = moved(routed)
        why = f" ({MOVES[Reason(move['reason'])]})" if move else ""
        return f"moved from {session.backend_id} to {outcome.backend_id}{why}"
    if estimate is not None and estimate.source == "ram":
        return "RAM cache miss: the evicted slot's state was not restored"
    if estimate is not None and ("lost" in estimate.note or estimate.evicts):
        return "its slot was evicted"
    if outcome.kind is EngineKind.VLLM:
        return "vLLM kept less of it than its prefix cache should (its blocks dropped, or a restart)"
    return "the engine reused less than it held"


def turn_record(
    routed: Routed, outcome: Outcome, request_id: str, prefill_tok_s: float, *, at: float
) -> dict[str, Any]:
    """The timeline entry of one finished turn (``at``: when it ended, epoch seconds)."""
    session, features = routed.session, routed.features
    chosen = routed.decision.chosen_candidate
    estimate = chosen.estimate if chosen else None
    cached = outcome.usage.cached_tokens or 0
    previous = session.prompt_tokens if session is not None and session.turns else 0
    reusable = min(previous, outcome.usage.prompt_tokens)
    stayed = session is None or session.backend_id in (None, outcome.backend_id)
    if outcome.kind is EngineKind.VLLM and stayed and estimate is not None:
        # what vLLM keeps by its rules (whole blocks; none of a hybrid model without prefix caching),
        # as turnout expected it: a turn that got that is not a break
        reusable = min(reusable, estimate.expected_cached_tokens)
    shortfall = reusable - cached
    deployment = routed.decision.chosen
    least = BREAK_MIN_TOKENS
    if outcome.kind is EngineKind.LLAMACPP and deployment and deployment.architecture is Architecture.HYBRID:
        least += max(checkpoint_gap(deployment) - DEFAULT_GAP, 0)  # its profile's micro-batch's gap
    broke = None
    if session is not None and previous and shortfall > max(least, BREAK_SHARE * reusable):
        cut = (
            where_it_breaks(session.shape, features.shape)
            if session.shape is not None and features.shape is not None
            else None
        )
        broke = {
            "kind": cut.kind if cut else "engine",
            "message": cut.message if cut else None,
            "role": cut.role if cut else None,
            "offset": cut.offset if cut else None,
            "cause": _prompt_cause(cut) if cut else _engine_cause(routed, outcome),
            "lost_tokens": shortfall,
            "lost_s": round(shortfall / prefill_tok_s, 3) if prefill_tok_s > 0 else None,
        }
    return {
        "at": at,
        "request_id": request_id,
        "backend": outcome.backend_id,
        "slot": routed.decision.slot,
        "prompt_tokens": outcome.usage.prompt_tokens,
        "cached_tokens": cached,
        "expected_cached_tokens": estimate.expected_cached_tokens if estimate else None,
        "predicted_ttft_s": round(estimate.ttft_s, 4) if estimate else None,
        "ttft_s": None if outcome.ttft_s is None else round(outcome.ttft_s, 4),
        "break": broke,
    }
