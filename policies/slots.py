"""llama.cpp slots: what pinning a prompt to each slot would give it, and what it would cost.

A prompt pinned to slot ``s`` reuses what ``s`` holds of it (the prefix index's ``SlotMatch``), times
the learned ``reuse``: all of it when the prompt extends what the slot holds (a hybrid slot continues
its live state); when the prompt diverges inside it, a hybrid slot restores its newest context
checkpoint at or below the divergence (``usable``). The prefix index keeps each slot's checkpoints
by llama-server's rules (``checkpoints_after``: each prompt adds two near its end, the deployment's
``slot_rules.checkpoint_gap`` and ``CHECKPOINT_TAIL`` tokens before it; a prompt that reuses less
erases those past what it reused), so one that an earlier, shorter prompt left (a chat's first turn,
just past a shared system prompt) serves every later prompt sharing that much; one near the end of
what the slot holds (``checkpoint_gap``) counts too. When ``s`` shares little with the prompt
(``consults_ram``: at most 10% of the prompt, or less than half of what ``s`` holds), llama-server
saves the slot to its RAM prompt cache and loads the best cached state: the longest prefix turnout
sent to the backend lately that llama-server saved there (``gateway.state.prefix_index``), by the
same rules, times the learned ``ram_reuse`` (at most ``reuse``: a restored state is matched as a
slot's is), if that entry is young enough to be there still (``ram_span`` within the learned
``ram_tokens``).

Every slot is an option (``llama_options``); the cost model picks the best objective:

- the session's own slot; if it is busy, the queue is what turnout predicts its running request
  still needs (``SlotState.busy_s``), else half a request;
- a free slot, or one whose lease expired (idle ``lease_idle_s``): no cost;
- another session's slot, at the **eviction cost** (a first turn known only by its content pays it
  too, and takes no lease: ``proven``); a slot busy with its holder's own turn costs the holder
  the wait for this request too (``holder_waits``: its prefill and half a typical request), since
  an active session's next turn comes soon; and that session's next turn re-prefills what it
  loses and restores the rest from RAM,
  ``prefill_s(tokens * max(reuse - ram_reuse, 0)) + ram_restore_s(tokens * ram_reuse)``
  (``policies.pricing``); but when this prompt shares at least half of itself, and more than 10%
  of the holder's conversation (a long common system prompt), the holder coming back finds the
  slot reused as it is (``consults_ram`` from its side) and gets back only what the slot rules give
  it (``slot_costs._left_for``): the shared prefix on a dense model, on a hybrid one a checkpoint,
  most often none; all of it weighed by the chance it comes back,
  ``0.5 ** (idle / (RECENCY_HALF_LIFE * lease_idle_s))`` (0 once the lease expired). Ties go to the
  session's own slot, then to a slot no other session holds, then to the least recently used one.

A restore from the RAM cache adds ``ram_restore_s(cached)`` to the queue of the request itself.

On a **crowded** llama-server (more active sessions at home there than slots: ``policies.homes``) a
session's turn names a slot only to start now: every option that waits is dropped and it may name
none instead, taking the first slot to free and its conversation from the RAM cache (its slot holds
another session's by then); a first turn and a one-off likewise. So every waiting task there is
unpinned, and llama-server serves them in arrival order.

A request without a session (or with no slot to name) may also name none (``_unpinned``):
llama-server then gives it a slot itself (``_lands``: the most similar idle one, else the least
recently used idle one, else the first to free), restoring its state from the RAM cache, and it pays
the eviction cost of the session holding that slot (the holder's wait too when it lands on a slot
busy with its holder's turn). Ties go to a named slot. By name such a request takes only an idle,
free slot, so llama-server's own LRU choice cannot evict a session's warm slot. Elsewhere than on a
crowded llama-server a session's turn always names a slot: unpinned, it would wait in llama-server's
deferred queue until a slot frees with no task pinned to it (a freed slot takes the oldest task
pinned to it first, and one deferred task is retried per release), the longest wait where turnout
pins the others. (Issue #45: offered beside the pinned options on contention-32-8llama, it was never
chosen; docs/benchmarks.md.)
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence

import msgspec

from policies.pricing import ram_restore_s
from policies.sessions import session_label
from policies.slot_costs import Ram, Situation, best_reuse, eviction, expired, holder_waits, slot_queue
from policies.slot_rules import SIMILARITY_THRESHOLD, consults_ram
from policies.types import (
    Architecture,
    BackendSnapshot,
    EngineKind,
    RequestFeatures,
    SessionSource,
    SessionView,
    SlotLease,
    SlotMatch,
)

DEFAULT_LEASE_IDLE_S = 600.0


def keep_chance(
    session: SessionView | None,
    leases: Mapping[str, Sequence[SlotLease]],
    slots: int,
    live_sessions: int,
) -> float:
    """The chance that a session pinned to a slot now still holds it on its next turns: 1 for a
    session that holds a slot already (eviction costs protect it) or while the sessions live on the
    gateway fit in the ``slots``; else a newcomer's share, ``slots / live sessions`` (itself included)."""
    if session is None or slots <= 0:
        return 1.0
    if any(lease.session_key == session.key for held in leases.values() for lease in held):
        return 1.0
    return min(1.0, slots / max(live_sessions, 1))


def slots_of(snapshot: BackendSnapshot) -> int:
    """The backend's llama.cpp slots (at least one)."""
    return max(snapshot.total_slots or len(snapshot.slots), 1)


def free_slot(snapshots: Sequence[BackendSnapshot], leases: Mapping[str, Sequence[SlotLease]]) -> bool:
    """Whether some llama.cpp slot is idle and held by no session: pinning a first turn there
    takes nothing from anyone."""
    for snapshot in snapshots:
        if snapshot.kind is not EngineKind.LLAMACPP:
            continue
        held = {lease.slot for lease in leases.get(snapshot.backend_id, ())}
        if any(not state.is_processing and state.id not in held for state in snapshot.slots):
            return True
    return False


def proven(features: RequestFeatures, session: SessionView | None) -> bool:
    """A session expected to continue: named by the client, or already recognised as a follow-up."""
    return session is not None and (
        features.session_source is not SessionSource.IMPLICIT or session.turns > 0
    )


class SlotOption(msgspec.Struct, frozen=True):
    """One way to send the request to a llama.cpp backend; ``note()`` explains it (built only for
    the option a candidate settles on: most options of a decision are never shown)."""

    slot: int | None
    cached: int
    source: str
    queue_s: float
    cached_next: int
    warm: bool = False
    evicts: str | None = None  # the session holding the slot taken (its lease is claimed from it)
    evict_cost_s: float = 0.0
    ram_potential: int = 0  # what the RAM cache would give were the entry there (for learning)
    usable: int = 0  # what the engine's rules let it reuse of the state it uses (``usable``; for learning)
    mine: bool = False  # the session's own slot
    slot_wait_s: float = 0.0  # a busy slot: ``queue_s`` starts with waiting this long for it, deferred
    deferred_s: float = 0.0  # of that wait, what turnout's own requests there do not account for
    expired: bool = False  # ``evicts``' lease expired (idle ``lease_idle_s``): it costs nothing
    lost: bool = False  # the session's slot no longer holds its prompt
    restore_s: float = 0.0  # loading ``cached`` back from the RAM cache (in ``queue_s``)
    restores: bool = False  # a hybrid state resumed from a context checkpoint, not extended live
    continues: bool = False  # a hybrid slot whose last prompt this one continues (live, or restored)
    lands: int | None = None  # no slot named (``slot`` None): the one llama-server is expected to give
    sharing: int = 0  # the sessions sharing a crowded server's slots (why no slot is named)

    @property
    def waits(self) -> bool:
        """The slot is busy: the request waits for it, deferred (not in the engine yet)."""
        return self.slot_wait_s > 0

    def note(self) -> str:
        slot, notes = self.slot, []
        if self.lost:
            how = "restore from the RAM cache" if self.source == "ram" else "full re-prefill"
            notes.append(f"session's slot was lost: {how}")
        if self.mine:
            notes.append(
                f"warm slot {slot}" if self.source == "slot" else f"slot {slot} ({self.source} reuse)"
            )
        if self.waits:
            wait = self.queue_s - self.restore_s
            if slot is not None:
                notes.append(f"waits ~{wait:.1f} s for slot {slot}")
            else:
                shared = f": {self.sharing} sessions share its slots" if self.sharing else ""
                notes.append(f"waits ~{wait:.1f} s for the first slot to free (no slot named{shared})")
        if self.evicts is not None:
            taken = f"slot {slot}" if slot is not None else f"slot {self.lands} (llama-server's pick)"
            holder = f"session {session_label(self.evicts)}"
            if self.expired:
                notes.append(f"takes {taken}: {holder}'s lease expired")
            else:
                notes.append(f"takes {taken} from {holder} (+{self.evict_cost_s:.2f} s next turn)")
        if self.source == "ram" and not self.mine and slot is not None:
            notes.append(f"slot {slot} restores {self.cached} tokens from the RAM cache")
        if self.restores and slot is not None:
            notes.append(f"slot {slot} resumes from a context checkpoint (the prompt diverges inside it)")
        return "; ".join(notes)


def llama_options(features: RequestFeatures, situation: Situation) -> list[SlotOption]:
    snapshot, session = situation.snapshot, situation.session
    count = snapshot.total_slots or len(snapshot.slots)
    holders = {lease.slot: lease for lease in situation.leases}
    own = next((lease for lease in situation.leases if session and lease.session_key == session.key), None)
    situation = _taken_over(situation, holders, own)
    hybrid = situation.deployment.architecture is Architecture.HYBRID
    states = {state.id: state for state in snapshot.slots}
    matches = {match.slot: match for match in situation.match.slots}
    ram = Ram.of(situation, hybrid)
    lost = (
        session is not None
        and own is None
        and session.backend_id == snapshot.backend_id
        and session.slot is not None
        and not matches.get(session.slot, SlotMatch(session.slot, 0)).whole
    )
    nxt = features.prompt_tokens if session is not None else 0
    options: list[SlotOption] = []
    for slot in range(count):
        lease = holders.get(slot)
        state = states.get(slot)
        if session is None and (lease is not None or (state is not None and state.is_processing)):
            continue  # a one-off request takes only an idle, free slot
        held = matches.get(slot) or SlotMatch(slot, 0)
        consults = consults_ram(held, features.prompt_tokens)
        got = best_reuse(situation, held, ram if consults else None, hybrid)
        mine = own is not None and lease is own
        queue, slot_wait, deferred = slot_queue(situation, state, mine)
        restore = ram_restore_s(situation.deployment, got.cached) if got.source == "ram" else 0.0
        resumed = situation.match.best_recent if got.source == "ram" else held
        restores = hybrid and got.cached > 0 and not resumed.whole
        continues = hybrid and got.cached > 0 and resumed.whole and got.source == "slot"
        queue += restore
        evicts, cost = None, 0.0
        if lease is not None and not mine:
            cost = eviction(lease, situation, held, features.prompt_tokens, got.from_slot)
            if state is not None and state.is_processing and not expired(lease, situation):
                cost += holder_waits(situation, features.prompt_tokens - got.cached, got.cached)
            evicts = lease.session_key  # even at no cost: the claim compares and sets against it
        options.append(
            SlotOption(
                slot, got.cached, got.source, queue, nxt,
                warm=mine and got.source == "slot",
                evicts=evicts,
                evict_cost_s=cost,
                ram_potential=got.potential,
                usable=got.usable,
                mine=mine,
                slot_wait_s=slot_wait,
                deferred_s=deferred,
                expired=lease is not None and evicts is not None and expired(lease, situation),
                lost=lost,
                restore_s=restore,
                restores=restores,
                continues=continues,
            )
        )  # fmt: skip
    if situation.sharing and session is not None:
        options = [option for option in options if not option.waits]  # pinned: only to start now
        options.append(
            msgspec.structs.replace(_unpinned(features, situation, ram), sharing=situation.sharing)
        )
    elif not options or session is None:
        options.append(_unpinned(features, situation, ram))
    return options


def _taken_over(situation: Situation, holders: Mapping[int, SlotLease], own: SlotLease | None) -> Situation:
    """The slots as this prompt will find them once the work sent there has run. The prefix index
    records a prompt when its request ends, a lease moves when a request is routed: the slot this
    session's last turn ran on, which the index says still holds that prompt (``whole``), but which
    another session has leased since, runs, or is about to run, that session's turn over it. (Only that
    slot: another slot holding a prefix of this prompt holds what its holder's finished request left
    there, a prompt this one repeats.) When this prompt gets there, the slot holds the other session's
    prompt (``lease.tokens``), sharing with this one what the prompts of sessions on this backend share
    (``shared``: the most any other slot's prompt shares with it, a system prompt), and the RAM cache is
    not counted on either: llama-server saved this session's state there only if the other turn
    consulted it (it reuses a slot that keeps half of what it holds as it is), and a deferred task takes
    a slot the moment it frees, before an idle slot is saved; the engine tells turnout of neither. Issue
    #45: with two sessions a slot on 8 llama-servers, turns waited 10 s for their "warm" slot behind the
    other session's turn and re-prefilled 20k tokens there, 12 s later than predicted; counting on the
    RAM cache instead, contention-32-8llama's mean TTFT was 1.35x dynamo-kv's (docs/benchmarks.md,
    2026-12-05). Past ~12k tokens the other turn does consult the cache and the state comes back, which
    this under-predicts; counting it where the prompts' sizes say so routed worse (docs/benchmarks.md,
    "2026-12-05 (late night)")."""
    match, session = situation.match, situation.session
    if session is None or session.slot is None or session.backend_id != situation.snapshot.backend_id:
        return situation
    last, lease = match.slot(session.slot), holders.get(session.slot)
    if not last.whole or lease is None or lease is own:
        return situation
    shared = max((m.tokens for m in match.slots if not m.whole), default=0)
    taken = SlotMatch(last.slot, shared, held=lease.tokens)
    slots = tuple(taken if m.slot == last.slot else m for m in match.slots)
    seen = msgspec.structs.replace(
        match, slots=slots, recent=min(shared, match.recent), recent_whole=False, recent_held=0, recent_age=0
    )
    return msgspec.structs.replace(situation, match=seen)


def _unpinned(features: RequestFeatures, situation: Situation, ram: Ram) -> SlotOption:
    """No ``id_slot``: llama-server takes the most similar idle slot, else the LRU one (+ RAM cache);
    with none idle, the first slot to free. Taking a slot another session holds evicts it as a pinned
    request would (``eviction``): naming no slot does not spare the session its cache."""
    snapshot, stats = situation.snapshot, situation.stats
    idle = [s.id for s in snapshot.slots if not s.is_processing]
    free = idle if snapshot.queued == 0 else []  # requests already queued take the idle slots first
    count = slots_of(snapshot)
    if free:
        queue, deferred = snapshot.prefill_backlog_s, 0.0
    else:
        busy = [s.busy_s for s in snapshot.slots if s.busy_s is not None]
        first = min(busy) if busy else stats.service_s.value / 2
        deferred = first + snapshot.queued * stats.service_s.value / count
        queue = deferred + snapshot.deferred_prefill_s  # as a busy slot's (``slot_queue``)
    hybrid = situation.deployment.architecture is Architecture.HYBRID
    similar = [
        m for m in map(situation.match.slot, idle) if m.tokens > SIMILARITY_THRESHOLD * features.prompt_tokens
    ]
    best = max(similar, key=lambda m: m.tokens, default=None)
    consults = best is None or consults_ram(best, features.prompt_tokens)
    got = best_reuse(situation, best, ram if consults else None, hybrid)
    nxt = round(features.prompt_tokens * stats.ram_reuse.value)
    lands = _lands(situation, free, best)
    lease = next((lease for lease in situation.leases if lease.slot == lands), None)
    mine = lease is not None and situation.session is not None and lease.session_key == situation.session.key
    cost, evicts = 0.0, None
    if lease is not None and not mine and lands is not None:
        cost = eviction(lease, situation, situation.match.slot(lands), features.prompt_tokens, got.from_slot)
        if not free and not expired(lease, situation):  # it lands on a slot busy with its holder's turn
            cost += holder_waits(situation, features.prompt_tokens - got.cached, got.cached)
        evicts = lease.session_key
    return SlotOption(
        None, got.cached, got.source, queue, nxt,
        evicts=evicts,
        evict_cost_s=cost,
        expired=lease is not None and evicts is not None and expired(lease, situation),
        ram_potential=got.potential,
        usable=got.usable,
        lands=lands,
        slot_wait_s=deferred,
        deferred_s=deferred,
    )  # fmt: skip


def _lands(situation: Situation, idle: Sequence[int], similar: SlotMatch | None) -> int | None:
    """The slot llama-server gives a request that names none: the most ``similar`` idle slot, else
    the least recently used idle one (a slot no lease holds first), else the first busy slot
    predicted to free."""
    if similar is not None:
        return similar.slot
    used = {lease.slot: lease.last_used for lease in situation.leases}
    if idle:
        return min(idle, key=lambda slot: (used.get(slot, -math.inf), slot))
    busy = [s for s in situation.snapshot.slots if s.is_processing]
    if not busy:
        return None
    return min(busy, key=lambda s: (s.busy_s if s.busy_s is not None else math.inf, s.id)).id
