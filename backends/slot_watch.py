"""What llama-server's ``/slots`` shows of a slot losing its cache while idle, and what to do about it.

A session pinned to its slot is only worth routing there while the slot keeps the conversation. With
``--kv-unified`` and ``--cache-idle-slots`` (llama-server's default when ``--cache-ram`` is on), every
idle slot is saved to the RAM cache and *cleared* whenever another slot starts a task; a request that
names the cleared slot by ``id_slot`` is not restored from RAM, so two interleaved pinned sessions
reuse nothing, turn after turn (measured on the H100 and on the CPU build: issue #61). ``/props``
does not say either flag. ``/slots`` shows it happen: an idle slot whose cached prompt
(``n_prompt_tokens``) dropped to 0 while its last task (``id_task``) stayed the same was cleared by the
server, not by a request. Two probes a short while apart see that (``cleared_while_idle``); ``turnout
config check`` makes it happen on purpose (``backends.llamacpp.LlamaCppAdapter.slot_test``).
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence

from policies.types import SlotState

CLEARED_IDLE_SLOTS = (
    "llama-server clears idle slots (--kv-unified with --cache-idle-slots): a pinned session loses its"
    " slot's cache whenever another slot starts a task, and turnout's slot pinning cannot pay; start it"
    " with --no-cache-idle-slots, or without --kv-unified"
)
"""The warning a backend's snapshot carries once it was seen (``BackendSnapshot.warnings``)."""


def cleared_while_idle(before: Iterable[SlotState], now: Sequence[SlotState]) -> list[int]:
    """The ids of the slots that held a prompt at the previous probe and, idle in both, with the same
    last task, hold nothing now."""
    seen = {slot.id: slot for slot in before}
    cleared = []
    for slot in now:
        was = seen.get(slot.id)
        if (
            was is not None
            and not was.is_processing
            and not slot.is_processing
            and was.task is not None
            and was.task == slot.task
            and (was.tokens or 0) > 0
            and slot.tokens == 0
        ):
            cleared.append(slot.id)
    return cleared
