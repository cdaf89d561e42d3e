"""What a context checkpoint restore costs a hybrid llama.cpp slot (``cache.checkpoint_restore_s``).

A hybrid model's recurrent state cannot be rolled back: when a prompt diverges inside what a slot
holds, llama-server restores the newest context checkpoint at or before the divergence (a copy of
the recurrent state it took 4 tokens before the previous prompt's end) and processes the rest; a
prompt that extends the slot's tokens uses the live state. On the H100's 27B shape a warm agent
turn of ~400 new tokens took 0.45-0.49 s where its tokens cost 0.36 s: the restore (~150 MB copied
back to the GPU), inside the engine's ``prompt_ms``. Calibrate's own warm points all extend their
slot, so its fit never saw it.

``measure`` grows a conversation on slot 1 by the same number of tokens each turn, alternately
extending it and dropping its last two tokens first (the checkpoint 4 tokens before the end is
restored); the median difference is the restore. It runs before the saves are timed: whether a
restore happened says whether the model keeps checkpoints at all, which the saves' fit needs.
"""

from __future__ import annotations

import statistics
from collections.abc import Callable, Sequence

from backends.calibrate.engines import Saved
from backends.calibrate.saves import PROBE_TOKENS, Send, SlotBook

DROP = 2
"""Tokens of the conversation a diverging turn drops: the slot restores its checkpoint 4 before the
end (a live state cannot go back 2)."""


async def measure(
    send: Send,
    book: SlotBook,
    prompt: Callable[[int], list[int]],
    without: Callable[[float, Sequence[Saved]], float],
    repeat: int = 3,
    slot: int = 1,
) -> float | None:
    """Seconds of one checkpoint restore (the median of ``repeat`` pairs), measured on ``slot`` as it
    continues its conversation (the saves each request waited for taken out by ``without``). None
    when no restore happened: the model is not hybrid (the diverging turn reused all it shared) or
    the server keeps no checkpoints (it re-processed everything), or the slot lost its conversation
    meanwhile (the extending turn did not reuse it)."""
    conversation = list(book.held.get(slot, [])) or prompt(4 * PROBE_TOKENS)
    if slot not in book.held:
        await send(conversation, slot)
    differences = []
    for _ in range(repeat):
        before = len(conversation)
        conversation = conversation + prompt(PROBE_TOKENS)
        extended = await send(conversation, slot)
        shared = len(conversation) - DROP
        conversation = conversation[:shared] + prompt(PROBE_TOKENS)
        diverged = await send(conversation, slot)
        if extended.cached < before - 4 or not 0 < diverged.cached < shared:
            return None  # lost, reused all it shared (no recurrent state), or nothing (no checkpoint)
        took = without(diverged.seconds, diverged.saved)
        differences.append(took - without(extended.seconds, extended.saved))
    return max(statistics.median(differences), 0.0)
