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
restored); the median difference is the restore.
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
) -> float | None:
    """Seconds of one checkpoint restore (the median of ``repeat`` pairs), measured on slot 1 as it
    continues its conversation (the saves each request waited for taken out by ``without``). None
    when no restore happened: the model is not hybrid (the diverging turn reused all it shared) or
    the server keeps no checkpoints (it re-processed everything)."""
    conversation = list(book.held.get(1, [])) or prompt(4 * PROBE_TOKENS)
    if 1 not in book.held:
        await send(conversation, 1)
    differences = []
    for _ in range(repeat):
        conversation = conversation + prompt(PROBE_TOKENS)
        extended = await send(conversation, 1)
        shared = len(conversation) - DROP
        conversation = conversation[:shared] + prompt(PROBE_TOKENS)
        diverged = await send(conversation, 1)
        if not 0 < diverged.cached < shared:
            return None  # reused all it shared (no recurrent state), or nothing (no checkpoint)
        took = without(diverged.seconds, diverged.saved)
        differences.append(took - without(extended.seconds, extended.saved))
    return max(statistics.median(differences), 0.0)
