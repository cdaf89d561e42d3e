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

- llama.cpp: the slot pinned to this session holds the conversation it last sent there, reused at
  the learned ``reuse`` ratio (hybrid checkpoints sit a few tokens before each prompt end); a slot
  that another session took, or a fresh one, holds nothing of it.
- vLLM: the prefix cache is global; of the prompt already sent there, whole learned blocks are
  reused at the learned ratio (hybrid models cache block-aligned; no hit was ever seen → nothing).

Slots (llama.cpp): the session's own slot if it still holds it; else a free slot; else, for a
session that has proven to continue (an explicit key, or a recognised follow-up), the least
recently used slot, whose session is evicted. A first, unrecognised request takes no slot from
anyone: llama-server chooses.
"""

from __future__ import annotations

from collections.abc import Sequence

from policies.learning import DeploymentStats, LearnedState
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
        cached = round(shared * stats.reuse.value)
        queue = _llama_queue(snapshot, stats, slot)
    else:
        shared = sent
        block = max(stats.block, 1)
        cached = int(shared * stats.reuse.value) // block * block if stats.block else 0
        queue = snapshot.queued * stats.service_s.value / max(snapshot.running, 1)
    cached = max(0, min(cached, prompt - 1))
    slowdown = 1 + BATCH_SLOWDOWN * snapshot.running
    decode_step = slowdown / stats.decode_tok_s.value
    ttft = queue + (prompt - cached) / stats.prefill_tok_s.value * slowdown + decode_step
    total = ttft + (expected_output(features, learned) - 1) * decode_step
    note = ""
    if evicts is not None:
        note = f"slot {slot} taken from session {evicts}"
    elif session is not None and snapshot.kind is EngineKind.LLAMACPP and sent and not warm:
        note = "session's slot was lost: full re-prefill"
    elif warm:
        note = f"warm slot {slot}"
    return Estimate(
        expected_cached_tokens=cached,
        queue_s=queue,
        ttft_s=ttft,
        total_s=total,
        shared_prefix_tokens=shared,
        slot=slot,
        warm=warm,
        evicts=evicts,
        note=note,
    )
