"""The cost model: for one candidate, the cached tokens to expect and the time to first token and
to the last one, from the snapshot, the prefix index's match, the slot leases and what was learned.

    prefill  = (prompt - cached) / prefill_tok_s * slowdown
    ttft     = queue_s * queue_factor + prefill + 1 / decode_tok_s
    total    = ttft + (expected_output - 1) / decode_tok_s * slowdown
    slowdown = 1 + BATCH_SLOWDOWN * requests already running on the engine
    objective = ttft + horizon * future_s + evict_cost_s        (total instead of ttft: cost-completion)

    queue_s  = an idle llama.cpp slot, or vLLM: the prefill backlog of turnout's requests in flight
               there (both engines process earlier prompt chunks first; ``backends.inflight``);
               vLLM at least queued * service_s / running from its own waiting queue
               a busy llama.cpp slot: what its request is predicted to still need (``busy_s``)
               llama.cpp unpinned with no idle slot: the first slot to free + queued * service_s / slots
    queue_factor: learned, how much longer queues really were than predicted (``policies.learning``)

**Expected cached tokens** come from the prefix index (``PrefixMatch``: what turnout sent where)
and each engine's semantics. Of a prefix of ``n`` tokens an engine reuses at most ``reusable(n)``
(whole blocks of ``n - 1``), times a learned ratio:

- llama.cpp, pinned to slot ``s``: what ``s`` holds of the prompt, times ``reuse`` (a hybrid slot
  continues its live state when the prompt extends what it holds; a prompt diverging inside it only
  finds a checkpoint near its end, ``CHECKPOINT_GAP``). When ``s`` shares little with the prompt
  (``consults_ram``: at most 10% of the prompt, or less than half of what ``s`` holds),
  llama-server saves the slot to its RAM prompt cache and loads the best cached state: the longest
  prefix turnout sent to the backend lately, times ``ram_reuse``, which learning drives to 0 on a
  server without ``--cache-ram``.
- vLLM: the longest prefix sent there lately, in whole learned blocks, times ``reuse`` (a cache that
  never hit predicts nothing).

**Slots** (llama.cpp). Every slot is an option; the best objective wins:

- the session's own slot; if it is busy, the queue is what turnout predicts its running request
  still needs (``SlotState.busy_s``), else half a request;
- a free slot, or one whose lease expired (idle ``lease_idle_s``): no cost;
- another session's slot (only for a session that has proven to continue: an explicit key, or a
  recognised follow-up), at the **eviction cost**: that session's next turn re-prefills what it
  loses and restores the rest from RAM,
  ``tokens * max(reuse - ram_reuse, 0) / prefill_tok_s + tokens * ram_reuse / RESTORE_TOK_S``,
  weighed by the chance it comes back, ``0.5 ** (idle / (RECENCY_HALF_LIFE * lease_idle_s))``
  (0 once the lease expired). Ties go to the least recently used slot.

A restore from the RAM cache adds ``cached / RESTORE_TOK_S`` to the queue of the request itself.

A request without a session takes no slot and names none, unless one is idle and free: then it is
pinned there, so llama-server's own LRU choice cannot evict a session's warm slot.

**Sessions look ahead**: a session expected to go on weighs its next turn's TTFT ``future_s``
``LOOKAHEAD_TURNS`` times: a pinned llama.cpp slot will hold the whole conversation, a vLLM serving
a hybrid model will re-prefill it.

    growth   = prompt - session's last prompt   (first turn: GROWTH_PRIOR of the prompt)
    future_s = queue_s + (prompt + growth - cached_next) / prefill_tok_s
               (this turn's queue again: contention outlasts one turn)
"""

from __future__ import annotations

import hashlib
from collections.abc import Sequence
from dataclasses import dataclass, replace

from policies.learning import DeploymentStats, LearnedState, reusable
from policies.types import (
    Architecture,
    BackendSnapshot,
    Deployment,
    EngineKind,
    Estimate,
    PrefixMatch,
    RequestFeatures,
    SessionSource,
    SessionView,
    SlotLease,
    SlotMatch,
    SlotState,
)

BATCH_SLOWDOWN = 0.06
LOOKAHEAD_TURNS = 3.0
GROWTH_PRIOR = 0.2
SIMILARITY_THRESHOLD = 0.1  # llama-server's --slot-prompt-similarity
DEFAULT_LEASE_IDLE_S = 600.0
CHECKPOINT_GAP = 4 + 512  # llama-server checkpoints a hybrid prompt at N - 4 - n_ubatch and N - 4
RESTORE_TOK_S = 200_000.0
"""Tokens of saved slot state llama-server copies per second between a slot and its RAM cache (about
64 KiB of KV per token of a 27B hybrid at ~13 GB/s): a restore is fast, not free."""
RECENCY_HALF_LIFE = 0.1
"""A lease's holder is half as likely to come back after idling this fraction of ``lease_idle_s``."""


@dataclass(frozen=True, slots=True)
class Situation:
    """Everything one candidate's estimate reads besides the request and the deployment."""

    snapshot: BackendSnapshot
    deployment: Deployment
    stats: DeploymentStats
    match: PrefixMatch
    session: SessionView | None
    leases: Sequence[SlotLease]
    now: float
    lease_idle_s: float


def label(key: str) -> str:
    """Session keys can be user ids: explanations show a short hash instead."""
    return hashlib.blake2b(key.encode(), digest_size=4).hexdigest()


def _reuse(shared: int, stats: DeploymentStats, ratio: float, *, token_exact: bool) -> int:
    """Tokens of a ``shared`` prefix the engine should reuse: whole blocks of ``shared - 1`` times ``ratio``.
    A block cache (vLLM) that never hit predicts nothing."""
    if shared <= 0 or (not token_exact and not stats.block):
        return 0
    block = 1 if token_exact else stats.block
    return round(reusable(shared, block) * ratio / block) * block


def expected_output(features: RequestFeatures, learned: LearnedState) -> int:
    typical = round(learned.for_model(features.model).completion_tokens.value)
    return max(1, min(features.max_tokens, typical) if features.max_tokens is not None else typical)


def _proven(features: RequestFeatures, session: SessionView | None) -> bool:
    """A session expected to continue: named by the client, or already recognised as a follow-up."""
    return session is not None and (
        features.session_source is not SessionSource.IMPLICIT or session.turns > 0
    )


@dataclass(frozen=True, slots=True)
class _Option:
    """One way to send the request to a llama.cpp backend."""

    slot: int | None
    cached: int
    source: str
    queue_s: float
    cached_next: int
    warm: bool = False
    evicts: str | None = None
    evict_cost_s: float = 0.0
    note: str = ""
    ram_potential: int = 0  # what the RAM cache would give were the entry there (for learning)


def _slot_state(snapshot: BackendSnapshot, slot: int) -> SlotState | None:
    return next((s for s in snapshot.slots if s.id == slot), None)


def _slot_queue(situation: Situation, slot: int) -> tuple[float, str]:
    """An idle slot starts now, behind the prompt chunks already in the engine (the prefill backlog);
    a busy one when its request is predicted to end."""
    state = _slot_state(situation.snapshot, slot)
    if state is None or not state.is_processing:
        return situation.snapshot.prefill_backlog_s, ""
    wait = state.busy_s if state.busy_s is not None else situation.stats.service_s.value / 2
    return wait, f"waits ~{wait:.1f} s for slot {slot}"


def _ram(features: RequestFeatures, situation: Situation) -> int:
    """What loading the best RAM cache entry would give (the slot rules of ``_from_slot``, at
    ``ram_reuse``), were it still there; see ``_in_ram``."""
    hybrid = situation.deployment.architecture is Architecture.HYBRID
    return _from_slot(situation.match.best_recent, situation, hybrid, situation.stats.ram_reuse.value)


def ram_span(match: PrefixMatch) -> int:
    """Tokens turnout sent to the backend since the matched prompt began: what must fit in the RAM
    cache for it to still be there (the cache drops its oldest entries first)."""
    return match.recent_age + match.recent_held if match.recent else 0


def _in_ram(situation: Situation) -> bool:
    return ram_span(situation.match) <= situation.stats.ram_tokens.value


def _from_slot(match: SlotMatch, situation: Situation, hybrid: bool, ratio: float | None = None) -> int:
    """What a slot's own state gives: all of it when the prompt extends it; for a hybrid model that
    diverges inside it, only a checkpoint near its end (N - 4 - 512 or later), else nothing."""
    tokens = match.tokens
    if hybrid and not match.whole and match.held:
        near_end = match.held > CHECKPOINT_GAP and tokens >= match.held - CHECKPOINT_GAP
        tokens = match.held - CHECKPOINT_GAP if near_end else 0
    ratio = situation.stats.reuse.value if ratio is None else ratio
    return _reuse(tokens, situation.stats, ratio, token_exact=True)


def consults_ram(match: SlotMatch, prompt_tokens: int) -> bool:
    """Whether llama-server loads from its RAM cache for a prompt pinned to this slot: when the slot
    shares no more than the similarity threshold with the prompt, or keeps less than half of what it
    holds (``f_keep < 0.5``). A slot holding a conversation that shares a long system prompt with
    this one is reused as it is, even when the RAM cache holds this conversation whole."""
    if match.tokens <= SIMILARITY_THRESHOLD * prompt_tokens or not match.held:
        return True
    return match.tokens / match.held < 0.5


def _pinned(features: RequestFeatures, situation: Situation, slot: int, hybrid: bool) -> tuple[int, str, int]:
    """Cached tokens and their source when pinned to ``slot`` (module docstring)."""
    held = situation.match.slot(slot)
    from_slot = _from_slot(held, situation, hybrid)
    potential = _ram(features, situation) if consults_ram(held, features.prompt_tokens) else 0
    from_ram = potential if _in_ram(situation) else 0
    if from_ram > from_slot:
        return from_ram, "ram", potential
    return from_slot, "slot" if from_slot else "none", potential


def _eviction(lease: SlotLease, situation: Situation, shares: bool) -> float:
    """What taking ``lease``'s slot costs its session's next turn (module docstring). When this
    prompt ``shares`` most of the slot's conversation, the holder coming back finds the slot kept as
    it is, not its own state loaded from RAM (``consults_ram``): it loses everything."""
    stats = situation.stats
    idle = max(situation.now - lease.last_used, 0.0)
    if idle >= situation.lease_idle_s:
        return 0.0
    comes_back = float(0.5 ** (idle / (RECENCY_HALF_LIFE * situation.lease_idle_s)))
    ram = 0.0 if shares else min(stats.ram_reuse.value, stats.reuse.value)
    lost = (
        lease.tokens * (stats.reuse.value - ram) / stats.prefill_tok_s.value
        + lease.tokens * ram / RESTORE_TOK_S
    )
    return comes_back * lost


def _llama_options(features: RequestFeatures, situation: Situation) -> list[_Option]:
    snapshot, session = situation.snapshot, situation.session
    count = snapshot.total_slots or len(snapshot.slots)
    holders = {lease.slot: lease for lease in situation.leases}
    own = next((lease for lease in situation.leases if session and lease.session_key == session.key), None)
    hybrid = situation.deployment.architecture is Architecture.HYBRID
    options: list[_Option] = []
    for slot in range(count):
        lease = holders.get(slot)
        mine = own is not None and lease is own
        state = _slot_state(snapshot, slot)
        if session is None and (lease is not None or (state is not None and state.is_processing)):
            continue  # a one-off request takes only an idle, free slot
        cached, source, potential = _pinned(features, situation, slot, hybrid)
        queue, waits = _slot_queue(situation, slot)
        queue += cached / RESTORE_TOK_S if source == "ram" else 0.0
        notes = [waits] if waits else []
        evicts, cost = None, 0.0
        if mine:
            notes.insert(0, f"warm slot {slot}" if source == "slot" else f"slot {slot} ({source} reuse)")
        elif lease is not None:
            shares = not consults_ram(situation.match.slot(slot), features.prompt_tokens)
            cost = _eviction(lease, situation, shares)
            if cost > 0 and not _proven(features, session):
                continue
            if cost > 0:
                evicts = lease.session_key
                notes.append(
                    f"takes slot {slot} from session {label(lease.session_key)} (+{cost:.2f} s next turn)"
                )
            else:
                notes.append(f"slot {slot}'s lease expired")
        if source == "ram" and not mine:
            notes.append(f"slot {slot} restores {cached} tokens from the RAM cache")
        nxt = features.prompt_tokens if session is not None else 0
        warm = mine and source == "slot"
        note = "; ".join(notes)
        options.append(_Option(slot, cached, source, queue, nxt, warm, evicts, cost, note, potential))
    if (
        session is not None
        and own is None
        and session.backend_id == snapshot.backend_id
        and session.slot is not None
    ):
        options = [_lost(o) for o in options]
    if not options or session is None:
        options.append(_unpinned(features, situation))
    return options


def _lost(option: _Option) -> _Option:
    how = "restore from the RAM cache" if option.source == "ram" else "full re-prefill"
    return replace(option, note="; ".join(filter(None, [f"session's slot was lost: {how}", option.note])))


def _unpinned(features: RequestFeatures, situation: Situation) -> _Option:
    """No ``id_slot``: llama-server takes the most similar idle slot, else the LRU one (+ RAM cache)."""
    snapshot, stats = situation.snapshot, situation.stats
    idle = [s.id for s in snapshot.slots if not s.is_processing]
    count = max(snapshot.total_slots or len(snapshot.slots) or 1, 1)
    if idle and snapshot.queued == 0:
        queue = snapshot.prefill_backlog_s
    else:
        busy = [s.busy_s for s in snapshot.slots if s.busy_s is not None]
        first = min(busy) if busy else stats.service_s.value / 2
        queue = first + snapshot.queued * stats.service_s.value / count
    hybrid = situation.deployment.architecture is Architecture.HYBRID
    similar = [
        m for m in map(situation.match.slot, idle) if m.tokens > SIMILARITY_THRESHOLD * features.prompt_tokens
    ]
    best = max(similar, key=lambda m: m.tokens, default=None)
    from_slot = _from_slot(best, situation, hybrid) if best is not None else 0
    potential = _ram(features, situation) if best is None or consults_ram(best, features.prompt_tokens) else 0
    from_ram = potential if _in_ram(situation) else 0
    cached, source = (
        (from_ram, "ram") if from_ram > from_slot else (from_slot, "slot" if from_slot else "none")
    )
    nxt = round(features.prompt_tokens * stats.ram_reuse.value)
    return _Option(None, cached, source, queue, nxt, ram_potential=potential)


def _objective(option: _Option, features: RequestFeatures, situation: Situation, horizon: float) -> float:
    stats = situation.stats
    queue = option.queue_s * stats.queue_factor.value
    ttft = queue + (features.prompt_tokens - option.cached) / stats.prefill_tok_s.value
    future = _future(features, situation, option.cached_next, queue)
    return ttft + horizon * future + option.evict_cost_s


def _future(features: RequestFeatures, situation: Situation, cached_next: int, queue_s: float) -> float:
    """Predicted TTFT of the session's next turn (module docstring): its prefill, behind a queue as
    long as this turn's (contention lasts longer than one turn)."""
    session, stats = situation.session, situation.stats
    if session is None:
        return 0.0
    prompt = features.prompt_tokens
    growth = prompt - session.prompt_tokens if session.turns > 0 else round(prompt * GROWTH_PRIOR)
    next_prompt = prompt + max(growth, 1)
    if situation.snapshot.kind is EngineKind.LLAMACPP:
        reused = _reuse(cached_next, stats, stats.reuse.value, token_exact=True)
    else:
        reused = _reuse(cached_next, stats, stats.reuse.value, token_exact=False)
    return queue_s + (next_prompt - min(reused, next_prompt - 1)) / stats.prefill_tok_s.value


def estimate(
    features: RequestFeatures,
    deployment: Deployment,
    snapshot: BackendSnapshot,
    *,
    session: SessionView | None,
    leases: Sequence[SlotLease],
    learned: LearnedState,
    match: PrefixMatch | None = None,
    now: float = 0.0,
    lease_idle_s: float = DEFAULT_LEASE_IDLE_S,
) -> Estimate:
    """Predict this candidate's reuse and timing (see the module docstring for the formulas)."""
    stats = learned.for_deployment(deployment, snapshot.kind)
    situation = Situation(
        snapshot, deployment, stats, match or PrefixMatch(), session, leases, now, lease_idle_s
    )
    horizon = LOOKAHEAD_TURNS if _proven(features, session) else 0.0
    if snapshot.kind is EngineKind.LLAMACPP:
        options = _llama_options(features, situation)
        last_used = {lease.slot: lease.last_used for lease in leases}
        option = min(
            options,
            key=lambda o: (
                round(_objective(o, features, situation, horizon), 6),
                o.slot is None,
                last_used.get(o.slot, -1.0) if o.slot is not None else 0.0,
            ),
        )
    else:
        cached = _reuse(situation.match.recent, stats, stats.reuse.value, token_exact=False)
        waiting = snapshot.queued * stats.service_s.value / max(snapshot.running, 1)
        queue = max(waiting, snapshot.prefill_backlog_s)
        option = _Option(None, cached, "prefix-cache" if cached else "none", queue, features.prompt_tokens)
    prompt = features.prompt_tokens
    cached = max(0, min(option.cached, prompt - 1))
    slowdown = 1 + BATCH_SLOWDOWN * snapshot.running
    decode_step = slowdown / stats.decode_tok_s.value
    prefill = (prompt - cached) / stats.prefill_tok_s.value * slowdown
    queue = option.queue_s * stats.queue_factor.value
    ttft = queue + prefill + decode_step
    total = ttft + (expected_output(features, learned) - 1) * decode_step
    if snapshot.kind is not EngineKind.LLAMACPP or option.source == "ram":
        shared = situation.match.recent  # what the engine may hold: learning measures its reuse of it
    elif option.slot is not None:
        shared = situation.match.slot(option.slot).tokens
    else:
        shared = option.cached
    return Estimate(
        expected_cached_tokens=cached,
        queue_s=queue,
        modelled_queue_s=option.queue_s,
        ttft_s=ttft,
        total_s=total,
        prefill_s=prefill,
        shared_prefix_tokens=shared,
        future_s=_future(features, situation, option.cached_next, queue) if horizon else 0.0,
        horizon=horizon,
        contended=snapshot.running > 0 or snapshot.queued > 0,
        slot=option.slot,
        warm=option.warm,
        evicts=option.evicts,
        evict_cost_s=option.evict_cost_s,
        source=option.source,
        ram_tokens=option.ram_potential,
        ram_span=ram_span(situation.match) if option.ram_potential else 0,
        note=option.note,
    )
