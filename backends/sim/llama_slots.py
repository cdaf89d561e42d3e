"""llama-server slots and the slot choice (``get_available_slot`` in ``server-context.cpp``), as pure logic.

Choice for a task with prompt ``P``:

1. ``id_slot != -1``: slot ``id_slot mod n_slots``, busy or not (a busy one makes the task wait).
2. Among idle, non-empty slots, the highest ``LCP(slot tokens, P) / len(P)`` that is strictly above
   ``SIMILARITY_THRESHOLD`` (0.1); ties keep the lower id.
3. Otherwise LRU: the idle slot with the smallest ``t_last_used``; the scan uses ``<=``, so ties (a
   fresh server) go to the highest id.

The choice also says whether the RAM prompt cache is updated (``backends.sim.ram_cache``): after an
LRU choice, and after a similarity choice that keeps less than half of the slot
(``f_keep = LCP / len(slot tokens) < 0.5``). A pinned idle, non-empty slot is judged by similarity
alone: at or below the threshold its ``f_keep`` counts as 0 (update); an empty one never updates
(``0/0``). A pinned busy slot defers the task; the choice is made again when it is retried.

When a slot is released, one deferred task is retried: the oldest one that pinned that slot, else the
oldest of all (``server_queue::pop_deferred_task``).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field

from backends.sim.prefix_cache import common_prefix
from backends.sim.task import SimTask

SIMILARITY_THRESHOLD = 0.1


@dataclass(eq=False)
class Slot:
    """One llama-server slot: its cached tokens (prompt + generated), checkpoints and current task."""

    id: int
    n_ctx: int
    tokens: list[int] = field(default_factory=list)
    checkpoints: tuple[int, ...] = ()
    t_last_used: int = 0
    task: SimTask | None = None
    last_task: SimTask | None = None

    @property
    def busy(self) -> bool:
        """Whether a task runs on this slot."""
        return self.task is not None


@dataclass(frozen=True, slots=True)
class SlotChoice:
    """Where a task goes, and whether the RAM prompt cache is updated for it (module docstring)."""

    slot: Slot | None
    update_cache: bool = False


def _keep_less_than_half(slot: Slot, prompt: Sequence[int], sim: float) -> bool:
    return sim * len(prompt) / len(slot.tokens) < 0.5


def select_slot(slots: Sequence[Slot], prompt: Sequence[int], id_slot: int) -> SlotChoice:
    """The slot a task goes to (maybe busy when pinned; None when every slot is busy)."""
    if id_slot != -1:
        slot = slots[id_slot % len(slots)]
        if slot.busy or not slot.tokens or not prompt:
            return SlotChoice(slot)
        sim = common_prefix(slot.tokens, prompt) / len(prompt)
        sim = sim if sim > SIMILARITY_THRESHOLD else 0.0
        return SlotChoice(slot, _keep_less_than_half(slot, prompt, sim))
    best: Slot | None = None
    best_sim = 0.0
    for slot in slots:
        if slot.busy or not slot.tokens or not prompt:
            continue
        sim = common_prefix(slot.tokens, prompt) / len(prompt)
        if sim > best_sim and sim > SIMILARITY_THRESHOLD:
            best, best_sim = slot, sim
    if best is not None:
        return SlotChoice(best, _keep_less_than_half(best, prompt, best_sim))
    lru: Slot | None = None
    for slot in slots:
        if not slot.busy and (lru is None or slot.t_last_used <= lru.t_last_used):
            lru = slot
    return SlotChoice(lru, lru is not None)


def pick_deferred(deferred: Sequence[SimTask], slot_id: int) -> int | None:
    """Index of the deferred task to retry when ``slot_id`` frees (pinned to it first, else the oldest)."""
    for index, task in enumerate(deferred):
        if task.id_slot == slot_id:
            return index
    return 0 if deferred else None
