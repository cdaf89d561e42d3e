"""What a context checkpoint costs a hybrid llama.cpp slot: restored (``cache.checkpoint_restore_s``)
and taken (``prefill.checkpoint_s``).

A hybrid model's recurrent state cannot be rolled back: when a prompt diverges inside what a slot
holds, llama-server restores the newest context checkpoint at or before the divergence (a copy of
the recurrent state it took 4 tokens before the previous prompt's end) and processes the rest; a
prompt that extends the slot's tokens uses the live state. On the H100's 27B shape a warm agent
turn of ~400 new tokens took 0.45-0.49 s where its tokens cost 0.36 s: the restore (~150 MB copied
back to the GPU), inside the engine's ``prompt_ms``. Calibrate's own warm points all extend their
slot, so its fit never saw it.

The server also takes checkpoints as it processes a prompt (``policies.checkpoints.
checkpoint_positions``): each is a copy of the recurrent state off the GPU that every slot waits for
(on the H100's 27B, ~150 MiB in ~0.12 s each: a warm turn of 400 tokens took three of them, 0.39 s of
its 0.56 s). A turn that extends its slot by 4 tokens takes one (where it starts), one that extends
it by 16 takes two (and 4 before its end).

``measure`` grows a fresh, short conversation on slot 1 three ways a round: by 16 tokens, by 16 after
dropping its last two tokens (the checkpoint 4 tokens before the end is restored), and by 4. The
median difference of the first two is the restore; of the first and the third, less what 12 more
tokens cost, a checkpoint taken. A checkpoint that ends a step cannot be timed apart from that
step (every checkpoint but the one where processing starts ends one), so the take carries a small
step's cost; short, so that the step's attention over the context before it stays small (on the
CPU build's tiny model, at 3,600 tokens of context, that step cost 7 ms where a whole 16-token
prompt took 3 ms). It runs before the saves are timed: whether a restore happened says whether
the model keeps checkpoints at all, which the saves' fit needs.
"""

from __future__ import annotations

import statistics
from collections.abc import Callable, Sequence
from dataclasses import dataclass

from backends.calibrate.engines import Saved
from backends.calibrate.saves import PROBE_TOKENS, Send
from policies.checkpoints import CHECKPOINT_TAIL

DROP = 2
"""Tokens of the conversation a diverging turn drops: the slot restores its checkpoint 4 before the
end (a live state cannot go back 2)."""


@dataclass(frozen=True)
class Checkpoints:
    """What a context checkpoint costs, as measured."""

    restore_s: float
    """One restored (the state copied back to the GPU)."""
    take_s: float
    """One taken while a prompt is processed (the state copied off the GPU)."""


async def measure(
    send: Send,
    prompt: Callable[[int], list[int]],
    without: Callable[[float, Sequence[Saved]], float],
    tokens_s: Callable[[int, int], float],
    repeat: int = 3,
    slot: int = 1,
) -> Checkpoints | None:
    """A checkpoint's restore and take (the medians of ``repeat`` rounds), measured on ``slot`` on a
    fresh conversation it grows (the saves each request waited for taken out by ``without``;
    ``tokens_s(new, cached)``: what the prefill of ``new`` tokens after ``cached`` costs without
    checkpoints, by the fit so far). None when no restore happened: the model is not hybrid (the
    diverging turn reused all it shared) or the server keeps no checkpoints (it re-processed
    everything), or the slot lost its conversation meanwhile (an extending turn did not reuse it)."""
    conversation = prompt(4 * PROBE_TOKENS)  # short: a small step's cost grows with the context before it
    await send(conversation, slot)
    restores, takes = [], []
    for _ in range(repeat):
        before = len(conversation)
        conversation = conversation + prompt(PROBE_TOKENS)
        extended = await send(conversation, slot)
        shared = len(conversation) - DROP
        conversation = conversation[:shared] + prompt(PROBE_TOKENS)
        diverged = await send(conversation, slot)
        held = len(conversation)
        conversation = conversation + prompt(CHECKPOINT_TAIL)
        short = await send(conversation, slot)  # one checkpoint, where it starts
        if extended.cached < before - 4 or not 0 < diverged.cached < shared or short.cached < held:
            return None  # lost, reused all it shared (no recurrent state), or nothing (no checkpoint)
        took = without(extended.seconds, extended.saved)
        restores.append(without(diverged.seconds, diverged.saved) - took)
        more = tokens_s(extended.processed, extended.cached) - tokens_s(short.processed, short.cached)
        takes.append(took - without(short.seconds, short.saved) - more)
    return Checkpoints(max(statistics.median(restores), 0.0), max(statistics.median(takes), 0.0))
