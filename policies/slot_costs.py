"""What pinning a prompt to one llama.cpp slot gives it and what it costs: the pieces ``policies.slots``
prices each slot option from (its module docstring states the rules).

A candidate is weighed in a ``Situation``; an option waits for its slot (``slot_queue``), reuses the
slot's own state or the RAM prompt cache's best entry (``best_reuse``, ``Ram``), and taking a slot
another session holds costs that session its cache (``eviction``) and, when the slot is busy with its
own turn, the wait for this request too (``holder_waits``), unless its lease expired (``expired``).
"""

from __future__ import annotations

from collections.abc import Sequence

import msgspec

from policies.learning import DeploymentStats
from policies.pricing import prefill_s, ram_restore_s
from policies.slot_rules import checkpoint_gap, consults_ram_by_counts, ram_span, reuse, usable
from policies.types import (
    Architecture,
    BackendSnapshot,
    Deployment,
    PrefixMatch,
    SessionView,
    SlotLease,
    SlotMatch,
    SlotState,
)

RECENCY_HALF_LIFE = 0.1
"""A lease's holder is half as likely to come back after idling this fraction of ``lease_idle_s``."""


class Situation(msgspec.Struct, frozen=True):
    """Everything one candidate's estimate reads besides the request and the deployment."""

    snapshot: BackendSnapshot
    deployment: Deployment
    stats: DeploymentStats
    match: PrefixMatch
    session: SessionView | None
    leases: Sequence[SlotLease]
    now: float
    lease_idle_s: float
    sharing: int = 0  # the active sessions at home there when more than its slots (``policies.homes``)


def slot_queue(situation: Situation, state: SlotState | None, mine: bool) -> tuple[float, float, float]:
    """The queue, the part of it spent waiting for the slot itself (deferred: not in the engine yet),
    and of that the part turnout's own requests there do not account for (a probe saw the slot busy:
    the fleet cannot know when that ends, ``backends.inflight``). An idle slot starts now, behind
    the prompt chunks already in the engine (the prefill backlog: requests deferred for a busy slot
    are not in it, and come after this one). A busy one when its request is predicted to end (and
    then it ``waits``), behind the prompts deferred meanwhile; not behind the backlog: llama-server
    runs the other slots' prompt chunks in the steps that decode the running request, and its
    predicted run (``busy_s``) is what it takes (issue #45: adding the backlog too over-predicted a
    busy slot's wait by 1.5 s on average on 8 llama-servers, and sessions left their slots for
    cold ones). The session's own slot
    (``mine``) seen busy by a probe taken before the session's last turn ended is idle, unless this
    replica has a request there: what the probe saw was that turn (``_busy_with_last_turn``)."""
    if state is None or not state.is_processing or (mine and _busy_with_last_turn(situation, state)):
        return situation.snapshot.prefill_backlog_s, 0.0, 0.0
    own = state.busy_s is not None
    wait = state.busy_s if state.busy_s is not None else situation.stats.service_s.value / 2
    snapshot = situation.snapshot
    return wait + snapshot.deferred_prefill_s, wait, 0.0 if own else wait


def _busy_with_last_turn(situation: Situation, state: SlotState) -> bool:
    """Whether the work a probe saw on the session's slot was the session's own last turn, ended
    since: the probe is older than that turn's end, and no request this replica knows of runs there
    (``busy_s``). A session's turns may alternate replicas behind a load balancer, and a replica only
    knows its own requests ended (``backends.inflight``); the session's record says when its last
    turn ended on any of them. Its slot is leased to it, so no other session's request runs there."""
    session = situation.session
    return (
        state.busy_s is None
        and session is not None
        and session.slot == state.id
        and session.backend_id == situation.snapshot.backend_id
        and session.last_seen > situation.snapshot.taken_at
    )


def _in_ram(situation: Situation) -> bool:
    return ram_span(situation.match) <= situation.stats.ram_tokens.value


class Reuse(msgspec.Struct, frozen=True):
    """What a slot choice reuses: ``cached`` tokens from ``source``, of ``usable`` by the engine's
    rules; ``potential``: what the RAM cache would give were its entry there (for learning)."""

    cached: int
    source: str
    usable: int
    potential: int

    @property
    def from_slot(self) -> int:
        """Tokens the engine reuses of the slot's own state (its count, not the learned
        expectation ``cached``): none when it loads a RAM entry instead."""
        return 0 if self.source == "ram" else self.usable


class Ram(msgspec.Struct, frozen=True):
    """The RAM cache's best entry for this prompt, the same for every slot: what a restore would
    give (``potential``, by the slot rules of ``usable`` at ``ram_reuse``, never above ``reuse``: a
    restored state is matched against the prompt as a slot's is, so it gives at most what the slot
    holding that state would), its usable tokens, and whether it is still there (``_in_ram``)."""

    potential: int
    usable: int
    there: bool

    @classmethod
    def of(cls, situation: Situation, hybrid: bool) -> Ram:
        tokens = usable(situation.match.best_recent, hybrid, checkpoint_gap(situation.deployment))
        stats = situation.stats
        ratio = min(stats.ram_reuse.value, stats.reuse.value)
        there = _in_ram(situation) and not _still_in_slot(situation)
        return cls(reuse(tokens, stats, ratio, token_exact=True), tokens, there)


def _still_in_slot(situation: Situation) -> bool:
    """Whether the slot that holds the best recent prefix is processing now: llama-server saves a
    slot's state to the RAM cache when it is idle and a task starts elsewhere, so a prompt still
    being prefilled there (a warm-up's, ``policies.warm``), or a slot running on from it, has no
    RAM entry yet."""
    recent = situation.match.recent
    if not recent:
        return False
    busy = {state.id for state in situation.snapshot.slots if state.is_processing}
    return any(m.slot in busy and m.tokens >= recent for m in situation.match.slots)


def best_reuse(situation: Situation, slot_match: SlotMatch | None, ram: Ram | None, hybrid: bool) -> Reuse:
    """The slot's own state (``slot_match``) or, when llama-server consults it (``ram`` given), the
    RAM cache's best entry, whichever gives more."""
    gap = checkpoint_gap(situation.deployment)
    slot_tokens = usable(slot_match, hybrid, gap) if slot_match is not None else 0
    from_slot = reuse(slot_tokens, situation.stats, situation.stats.reuse.value, token_exact=True)
    if ram is not None and ram.there and ram.potential > from_slot:
        return Reuse(ram.potential, "ram", ram.usable, ram.potential)
    return Reuse(from_slot, "slot" if from_slot else "none", slot_tokens, ram.potential if ram else 0)


def expired(lease: SlotLease, situation: Situation) -> bool:
    """A lease idle ``lease_idle_s`` or longer: its session is not expected back, and the slot is
    anyone's at no cost."""
    return situation.now - lease.last_used >= situation.lease_idle_s


def eviction(lease: SlotLease, situation: Situation, held: SlotMatch, prompt: int, cached: int) -> float:
    """What taking ``lease``'s slot costs its session's next turn (``policies.slots``' module
    docstring): ``held`` is what the slot holds of this prompt (``prompt`` tokens, ``cached`` of them
    reused from the slot by the engine's count). The holder coming back finds this prompt in the slot;
    llama-server loads its state from the RAM cache only if the slot shares little with it
    (``consults_ram``), else it reuses the slot as it is: what the two prompts share, by the slot rules
    (``_left_for``), often nothing on a hybrid model. The RAM cache holds the holder's state because
    llama-server saves every idle slot there when a task starts (``--cache-idle-slots``, on by default)."""
    stats = situation.stats
    if expired(lease, situation):
        return 0.0
    idle = max(situation.now - lease.last_used, 0.0)
    comes_back = float(0.5 ** (idle / (RECENCY_HALF_LIFE * situation.lease_idle_s)))
    deployment = situation.deployment
    mine = lease.tokens * stats.reuse.value
    if consults_ram_by_counts(held.tokens, lease.tokens, prompt):  # the holder's prompt against this one
        ram = lease.tokens * min(stats.ram_reuse.value, stats.reuse.value)
        lost = prefill_s(deployment, stats, mine - ram, prompt=False) + ram_restore_s(deployment, ram)
    else:
        kept = min(_left_for(deployment, held, prompt, cached), mine)
        lost = prefill_s(deployment, stats, mine - kept, round(kept), prompt=False)
    return comes_back * lost


def holder_waits(situation: Situation, new: int, cached: int) -> float:
    """What taking a slot busy with its holder's own turn costs the holder besides its cache
    (``policies.slots``' module docstring): the holder is active, its next turn comes soon after this
    one ends, and finds the slot running the taker: it waits the taker's prefill (``new`` tokens after
    ``cached``) and, for its answer, half a typical request there (``service_s``). Issue #45: priced
    as a RAM restore alone (~0.1 s), a one-off request took an agent's slot the moment its turn ended,
    and the agent's next turn waited 5-9 s or re-prefilled elsewhere (contention-16-8llama)."""
    stats = situation.stats
    return prefill_s(situation.deployment, stats, max(new, 1), cached) + stats.service_s.value / 2


def _left_for(deployment: Deployment, held: SlotMatch, prompt: int, cached: int) -> float:
    """Tokens of the holder's conversation a slot still gives it back after this prompt ran there,
    by the slot rules (``usable``): the slot holds this prompt, sharing ``held.tokens`` with the
    holder's, and of the slot's own checkpoints those at or below what this prompt reused (the
    engine keeps them). Never ``whole``: this prompt's answer follows it in the slot."""
    own = held.checkpoint if held.checkpoint <= cached else 0
    after = SlotMatch(held.slot, held.tokens, held=prompt, checkpoint=own)
    return usable(after, deployment.architecture is Architecture.HYBRID, checkpoint_gap(deployment))
