"""The cost model: for one candidate, the cached tokens to expect and the time to first token and
to the last one, from the snapshot, the session's state and what was learned.

    queue_s  = pinned llama slot busy:        service_s / 2           (half a request, on average)
               llama, no idle slot:           (queued + 1) * service_s / slots
               vLLM (continuous batching):    queued * service_s / max(running, 1)
    prefill  = (prompt - cached) / prefill_tok_s * slowdown
    ttft     = queue_s + prefill + 1 / decode_tok_s
    total    = ttft + (expected_output - 1) / decode_tok_s * slowdown
    slowdown = 1 + BATCH_SLOWDOWN * requests already running on the engine

Expected cached tokens follow each engine's semantics:

Of a prefix of ``n`` tokens an engine can reuse at most ``reusable(n)``: whole blocks of ``n - 1``
(it recomputes at least the last token), times the learned ``reuse`` ratio:

- llama.cpp: the slot pinned to this session holds the conversation it last sent there, reused
  token by token (hybrid checkpoints sit a few tokens before each prompt end); a slot
  that another session took, or a fresh one, holds nothing of it.
- vLLM: the prefix cache is global; of the prompt already sent there, whole learned blocks are
  reused (hybrid models cache block-aligned; a cache that never hit predicts nothing).

Sessions look ahead: a session expected to go on (an explicit key, or a conversation already
recognised as a follow-up) also weighs the next turn's TTFT, ``future_s``, ``LOOKAHEAD_TURNS``
times: after this turn, a llama.cpp slot holds the whole conversation, while a vLLM serving a
hybrid model will re-prefill it. That is what moves a growing agent conversation onto a warm
slot before it has grown large; a one-off request (``horizon`` 0) is routed on this turn alone.

    growth   = prompt - session's last prompt   (first turn: GROWTH_PRIOR of the prompt)
    future_s = (prompt + growth - cached_next) / prefill_tok_s
    cached_next: the reuse below, for the whole of this prompt

Slots (llama.cpp): the session's own slot if it still holds it; else a free slot; else, for a
session that has proven to continue (an explicit key, or a recognised follow-up), the least
recently used slot, whose session is evicted. A first, unrecognised request takes no slot from
anyone: llama-server chooses.
"""

from __future__ import annotations

import hashlib
from collections.abc import Sequence

from policies.learning import DeploymentStats, LearnedState, reusable
from policies.types import (
    BackendSnapshot,
    Deployment,
    EngineKind,
    Estimate,
    RequestFeatures,
    SessionSource,
    SessionView,
    SlotLease,
)

BATCH_SLOWDOWN = 0.06
LOOKAHEAD_TURNS = 3.0
GROWTH_PRIOR = 0.2


def _slot_for(
    snapshot: BackendSnapshot,
    leases: Sequence[SlotLease],
    session: SessionView | None,
    features: RequestFeatures,
) -> tuple[int | None, bool, str | None]:
    """(slot, warm, evicted session key) for a llama.cpp candidate."""
    if session is None:
        return None, False, None
    own = next((lease for lease in leases if lease.session_key == session.key), None)
    if own is not None:
        return own.slot, True, None
    count = snapshot.total_slots or len(snapshot.slots)
    held = {lease.slot for lease in leases}
    free = [slot for slot in range(count) if slot not in held]
    if free:
        return free[0], False, None
    proven = features.session_source is not SessionSource.IMPLICIT or session.turns > 0
    if not proven or not leases:
        return None, False, None
    victim = min(leases, key=lambda lease: (lease.last_used, lease.slot))
    return victim.slot, False, victim.session_key


def _expected_reuse(shared: int, stats: DeploymentStats, *, token_exact: bool) -> int:
    """Tokens of a ``shared`` prefix the engine should reuse: whole learned blocks of ``shared - 1``
    times the learned reuse ratio. A block cache (vLLM) that never hit predicts nothing."""
    if shared <= 0 or (not token_exact and not stats.block):
        return 0
    block = 1 if token_exact else stats.block
    possible = reusable(shared, block)
    return round(possible * stats.reuse.value / block) * block


def _label(key: str) -> str:
    """Session keys can be user ids: explanations show a short hash instead."""
    return hashlib.blake2b(key.encode(), digest_size=4).hexdigest()


def _slot_busy(snapshot: BackendSnapshot, slot: int) -> bool:
    return any(s.id == slot and s.is_processing for s in snapshot.slots)


def _llama_queue(snapshot: BackendSnapshot, stats: DeploymentStats, slot: int | None) -> float:
    service = stats.service_s.value
    if slot is not None:
        return service / 2 if _slot_busy(snapshot, slot) else 0.0
    count = max(snapshot.total_slots or len(snapshot.slots) or 1, 1)
    if snapshot.running < count and snapshot.queued == 0:
        return 0.0
    return (snapshot.queued + 1) * service / count


def expected_output(features: RequestFeatures, learned: LearnedState) -> int:
    typical = round(learned.for_model(features.model).completion_tokens.value)
    return max(1, min(features.max_tokens, typical) if features.max_tokens is not None else typical)


def estimate(
    features: RequestFeatures,
    deployment: Deployment,
    snapshot: BackendSnapshot,
    *,
    session: SessionView | None,
    leases: Sequence[SlotLease],
    learned: LearnedState,
) -> Estimate:
    """Predict this candidate's reuse and timing (see the module docstring for the formulas)."""
    stats = learned.for_deployment(deployment, snapshot.kind)
    prompt = features.prompt_tokens
    sent = session.sent_to(snapshot.backend_id) if session is not None else 0
    slot, warm, evicts = None, False, None
    if snapshot.kind is EngineKind.LLAMACPP:
        slot, warm, evicts = _slot_for(snapshot, leases, session, features)
        shared = sent if warm else 0
        cached = _expected_reuse(shared, stats, token_exact=True)
        queue = _llama_queue(snapshot, stats, slot)
    else:
        shared = sent
        cached = _expected_reuse(shared, stats, token_exact=False)
        queue = snapshot.queued * stats.service_s.value / max(snapshot.running, 1)
    cached = max(0, min(cached, prompt - 1))
    slowdown = 1 + BATCH_SLOWDOWN * snapshot.running
    decode_step = slowdown / stats.decode_tok_s.value
    ttft = queue + (prompt - cached) / stats.prefill_tok_s.value * slowdown + decode_step
    total = ttft + (expected_output(features, learned) - 1) * decode_step
    horizon = 0.0
    future = 0.0
    if session is not None and (features.session_source is not SessionSource.IMPLICIT or session.turns > 0):
        horizon = LOOKAHEAD_TURNS
        growth = prompt - session.prompt_tokens if session.turns > 0 else round(prompt * GROWTH_PRIOR)
        next_prompt = prompt + max(growth, 1)
        if snapshot.kind is EngineKind.LLAMACPP and slot is not None:
            cached_next = _expected_reuse(prompt, stats, token_exact=True)
        elif snapshot.kind is EngineKind.LLAMACPP:
            cached_next = 0  # llama-server picks a slot; no promise it keeps this one
        else:
            cached_next = _expected_reuse(prompt, stats, token_exact=False)
        future = (next_prompt - min(cached_next, next_prompt - 1)) / stats.prefill_tok_s.value
    notes = []
    if session is not None and snapshot.kind is EngineKind.LLAMACPP and sent and not warm:
        notes.append("session's slot was lost: full re-prefill")
    if evicts is not None:
        notes.append(f"takes slot {slot} from session {evicts[:2]}{_label(evicts)}")
    elif warm:
        notes.append(f"warm slot {slot}")
    note = "; ".join(notes)
    return Estimate(
        expected_cached_tokens=cached,
        queue_s=queue,
        ttft_s=ttft,
        total_s=total,
        shared_prefix_tokens=shared,
        future_s=future,
        horizon=horizon,
        contended=snapshot.running > 0 or snapshot.queued > 0,
        slot=slot,
        warm=warm,
        evicts=evicts,
        note=note,
    )
