"""What llama-server's RAM-cache saves add to calibrate's measurements, and what a save costs.

llama-server (``server-context.cpp``, with ``--cache-ram`` on) copies a slot's state into its RAM
prompt cache at two moments, and the request being started waits for it:

- a slot taken for a prompt that does not continue it (a named slot whose prompt shares at most 10%
  with it, or keeps less than half of it) is saved first;
- after each launch, every idle slot not saved yet (``--cache-idle-slots``, on by default).

A state already in the cache is not saved again. Calibrate's cold prefills all go to slot 0 with fresh
prompts, so each one paid a save of the prompt before it (on the H100's 27B, 0.3-0.7 s: a 16-token
prefill was measured at 0.33 s, and the fitted per-request cost took it). ``SlotBook`` follows which
saves each of calibrate's requests made; ``measure`` times a save at two sizes (a request on slot 1
that continues its own prompt, with and without slot 0 waiting to be saved); ``without`` takes the
saves back out of a measured time.
"""

from __future__ import annotations

import statistics
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass, field

from backends.calibrate.engines import Prefill
from backends.sim.prefix_cache import common_prefix

SIMILARITY = 0.1
"""llama-server's ``--slot-prompt-similarity`` default: a named slot sharing no more than this share
of the prompt is taken as not similar (and saved before it is reused)."""
KEEP = 0.5
"""A slot reused for a prompt that keeps less than this share of what it holds is saved first."""
PROBE_TOKENS = 16


@dataclass
class SlotBook:
    """Calibrate's own requests, slot by slot: what each slot holds and which are in the RAM cache."""

    held: dict[int, list[int]] = field(default_factory=dict)
    saved: set[int] = field(default_factory=set)

    def launch(self, tokens: Sequence[int], slot: int) -> tuple[int, ...]:
        """A request for ``tokens`` on ``slot`` starts: the sizes (tokens held) of the slots the
        server saves before it goes on (module docstring)."""
        saves: list[int] = []
        own = self.held.get(slot, [])
        if own and slot not in self.saved and tokens:
            shared = common_prefix(own, tokens)
            if shared / len(tokens) <= SIMILARITY or shared / len(own) < KEEP:
                saves.append(len(own))
        for other, content in sorted(self.held.items()):
            if other != slot and content and other not in self.saved:
                saves.append(len(content))
                self.saved.add(other)
        self.held[slot] = list(tokens)
        self.saved.discard(slot)
        return tuple(saves)

    def together(self, prompts: Sequence[Sequence[int]]) -> None:
        """Prompts started on slots 0, 1, ... at once (the decode steps): what they leave held."""
        for slot, tokens in enumerate(prompts):
            self.launch(tokens, slot)
        self.saved.difference_update(range(len(prompts)))


@dataclass(frozen=True)
class SaveCost:
    """Seconds a save stops the server for: ``fixed`` + ``per_token`` x the tokens the slot holds."""

    fixed: float = 0.0
    per_token: float = 0.0

    def seconds(self, tokens: int) -> float:
        return self.fixed + self.per_token * tokens if tokens > 0 else 0.0

    def without(self, seconds: float, saves: Sequence[int]) -> float:
        """``seconds`` measured for a request that waited for ``saves``, without them."""
        return max(seconds - sum(self.seconds(t) for t in saves), 0.0)


Send = Callable[[Sequence[int], int], Awaitable[Prefill]]
"""Send ``tokens`` to ``slot`` (through the book) and return what the client saw."""


async def measure(
    send: Send,
    book: SlotBook,
    prompt: Callable[[int], list[int]],
    sizes: Sequence[int],
    repeat: int = 3,
) -> SaveCost | None:
    """Time one save of slot 0 holding each of ``sizes`` tokens (the median of ``repeat``): slot 1
    continues its own prompt by ``PROBE_TOKENS`` while slot 0 waits to be saved, and once more right
    after (nothing to save); the difference is the save. The line through the two sizes (clamped at
    0: a server without ``--cache-ram`` saves nothing; with ``--no-cache-idle-slots`` this times 0
    while the saves before a slot is taken remain). None when slot 1 did not keep its prompt between
    the two (with ``--kv-unified`` an idle slot is cleared when it is saved: the probe would time a
    re-prefill)."""
    measured: list[tuple[int, float]] = []
    tail = list(book.held.get(1, [])) or prompt(PROBE_TOKENS)
    if 1 not in book.held:
        await send(tail, 1)
    for size in sizes:
        differences = []
        for _ in range(repeat):  # the median: one pair's difference is mostly noise on a busy machine
            await send(prompt(size), 0)
            tail = tail + prompt(PROBE_TOKENS)
            waited = await send(tail, 1)
            tail = tail + prompt(PROBE_TOKENS)
            alone = await send(tail, 1)
            if min(waited.cached, alone.cached) < len(tail) - 2 * PROBE_TOKENS - 1:
                return None  # slot 1 lost its prompt meanwhile
            differences.append(waited.seconds - alone.seconds)
        measured.append((size, max(statistics.median(differences), 0.0)))
    (small, s_small), (large, s_large) = measured[0], measured[-1]
    per_token = max((s_large - s_small) / (large - small), 0.0) if large > small else 0.0
    return SaveCost(max(s_small - per_token * small, 0.0), per_token)
