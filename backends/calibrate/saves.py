"""What llama-server's RAM-cache saves add to calibrate's measurements, and what a save costs.

llama-server (``server-context.cpp``, with ``--cache-ram`` on) copies a slot's state into its RAM
prompt cache at two moments, and the request being started waits for it:

- a slot taken for a prompt that does not continue it (a named slot whose prompt shares at most 10%
  with it, or keeps less than half of it) is saved first;
- after each launch, every idle slot not saved yet (``--cache-idle-slots``, on by default).

A state already in the cache is not saved again. Calibrate's cold prefills all go to slot 0 with fresh
prompts, so each one paid a save of the prompt before it (on the H100's 27B, 0.3-0.7 s: a 16-token
prefill was measured at 0.33 s, and the fitted per-request cost took it). ``SlotBook`` follows which
saves each of calibrate's requests made, with the tokens and the context checkpoints each slot saved
held (a hybrid slot's state carries a copy of its recurrent state per checkpoint: on the H100's 27B a
slot that held a three-turn conversation took 0.79 s to save where one prompt of as many tokens took
0.23 s); ``measure`` times a save at two sizes and once more after a conversation of short turns (a
request on slot 1 that continues its own prompt, with and without slot 0 waiting to be saved);
``without`` takes the saves back out of a measured time.
"""

from __future__ import annotations

import statistics
from collections.abc import Awaitable, Callable, Collection, Sequence
from dataclasses import dataclass, field

from backends.calibrate.engines import Prefill, Saved
from backends.sim.prefix_cache import add_checkpoints, common_prefix, llama_reuse
from backends.sim.ram_cache import RamCache, StateSizes
from policies.checkpoints import DEFAULT_GAP

SIMILARITY = 0.1
"""llama-server's ``--slot-prompt-similarity`` default: a named slot sharing no more than this share
of the prompt is taken as not similar (and saved before it is reused)."""
KEEP = 0.5
"""A slot reused for a prompt that keeps less than this share of what it holds is saved first."""
PROBE_TOKENS = 16
TURNS = 8
"""Short turns of the conversation the third save is timed after: each leaves two checkpoints (one
where it starts, one 4 tokens before its end)."""


@dataclass
class SlotBook:
    """Calibrate's own requests, slot by slot: what each slot holds (its tokens and context
    checkpoints) and what the server's RAM cache holds (the simulator's ``RamCache``, unbounded:
    calibrate's prompts fit in any ``--cache-ram`` it would be run with), by the server's rules."""

    held: dict[int, list[int]] = field(default_factory=dict)
    checkpoints: dict[int, tuple[int, ...]] = field(default_factory=dict)
    cache: RamCache = field(default_factory=lambda: RamCache(0, 0, StateSizes()))
    gap: int = DEFAULT_GAP
    """Where the server takes its first near-end checkpoint: ``min(batch, 4 + ubatch)``."""
    hybrid: bool = True
    """The model keeps context checkpoints (a recurrent state); calibrate's restore probe says."""

    def launch(self, tokens: Sequence[int], slot: int, busy: Collection[int] = ()) -> tuple[Saved, ...]:
        """A request for ``tokens`` on ``slot`` starts (``busy`` slots are working): the slots the
        server saves before it goes on (module docstring), each as the tokens and checkpoints it held.
        A slot taken for another prompt is saved, then loads the cache's best state for the prompt."""
        saves: list[Saved] = []
        own, kept = self.held.get(slot, []), self.checkpoints.get(slot, ())
        if own and tokens:
            shared = common_prefix(own, tokens)
            if shared / len(tokens) <= SIMILARITY or shared / len(own) < KEEP:
                if self.cache.save(own, kept):
                    saves.append((len(own), len(kept)))
                entry = self.cache.load(own, tokens)
                if entry is not None:
                    own, kept = entry.tokens, entry.checkpoints
        reuse = llama_reuse(own, kept, tokens, hybrid=self.hybrid)
        later = add_checkpoints(reuse.checkpoints, len(tokens), reuse.n_past, self.gap)
        self.checkpoints[slot] = later if self.hybrid else ()
        self.held[slot] = list(tokens)
        for other, content in sorted(self.held.items()):
            if other != slot and other not in busy and self.cache.save(content, self.checkpoints[other]):
                saves.append((len(content), len(self.checkpoints[other])))
        return tuple(saves)

    def together(self, prompts: Sequence[Sequence[int]]) -> None:
        """Prompts started on slots 0, 1, ... at once (the decode steps): what they leave held."""
        for slot, tokens in enumerate(prompts):
            self.launch(tokens, slot, busy=range(len(prompts)))


@dataclass(frozen=True)
class SaveCost:
    """Seconds a save stops the server for: ``fixed`` + ``per_token`` x the tokens the slot holds +
    ``per_checkpoint`` x its context checkpoints."""

    fixed: float = 0.0
    per_token: float = 0.0
    per_checkpoint: float = 0.0

    def seconds(self, saved: Saved) -> float:
        tokens, checkpoints = saved
        if tokens <= 0:
            return 0.0
        return self.fixed + self.per_token * tokens + self.per_checkpoint * checkpoints

    def without(self, seconds: float, saves: Sequence[Saved]) -> float:
        """``seconds`` measured for a request that waited for ``saves``, without them."""
        return max(seconds - sum(self.seconds(s) for s in saves), 0.0)


Send = Callable[[Sequence[int], int], Awaitable[Prefill]]
"""Send ``tokens`` to ``slot`` (through the book) and return what the client saw."""


async def measure(
    send: Send,
    book: SlotBook,
    prompt: Callable[[int], list[int]],
    sizes: Sequence[int],
    repeat: int = 3,
) -> SaveCost | None:
    """Time one save of slot 0 holding each of ``sizes`` tokens, and once more holding a conversation
    of the smaller size and ``TURNS`` short turns (the median of ``repeat`` each): slot 1 continues
    its own prompt by ``PROBE_TOKENS`` while slot 0 waits to be saved, and once more right after
    (nothing to save); the difference is the save. The fit through the three (``fit``; clamped at 0:
    a server without ``--cache-ram`` saves nothing; with ``--no-cache-idle-slots`` this times 0 while
    the saves before a slot is taken remain). None when slot 1 did not keep its prompt between the
    two (with ``--kv-unified`` an idle slot is cleared when it is saved: the probe would time a
    re-prefill)."""
    measured: list[tuple[Saved, float]] = []
    tail = list(book.held.get(1, [])) or prompt(PROBE_TOKENS)
    if 1 not in book.held:
        await send(tail, 1)
    for size, turns in [*((n, 0) for n in sizes), (sizes[0], TURNS)]:
        differences, held = [], (0, 0)
        for _ in range(repeat):  # the median: one pair's difference is mostly noise on a busy machine
            conversation = prompt(size)
            await send(conversation, 0)
            for _ in range(turns):
                conversation = conversation + prompt(PROBE_TOKENS)
                await send(conversation, 0)
            tail = tail + prompt(PROBE_TOKENS)
            waited = await send(tail, 1)
            tail = tail + prompt(PROBE_TOKENS)
            alone = await send(tail, 1)
            if min(waited.cached, alone.cached) < len(tail) - 2 * PROBE_TOKENS - 1:
                return None  # slot 1 lost its prompt meanwhile
            differences.append(waited.seconds - alone.seconds)
            held = waited.saved[0] if waited.saved else (len(conversation), 0)
        measured.append((held, max(statistics.median(differences), 0.0)))
    return fit(measured)


def fit(points: Sequence[tuple[Saved, float]]) -> SaveCost:
    """The save cost through measured ``((tokens, checkpoints), seconds)`` points: the line through
    the first two (one prompt each) by tokens, then the checkpoints' part from the third (a
    conversation), each part clamped at 0. The first two may hold different numbers of checkpoints
    (at ``--ubatch-size`` 2048 a 1,024-token prompt leaves one, an 8,192-token one two): the
    checkpoints' part is solved for first where the three allow it."""
    ((t1, k1), s1), ((t2, k2), s2) = points[0], points[1]
    per_checkpoint = 0.0
    if len(points) > 2:
        (t3, k3), s3 = points[2]
        # s = a + b t + c k through three points: eliminate a, then b
        denominator = (k3 - k1) * (t2 - t1) - (k2 - k1) * (t3 - t1)
        if denominator and t2 != t1:
            per_checkpoint = max(((s3 - s1) * (t2 - t1) - (s2 - s1) * (t3 - t1)) / denominator, 0.0)
    rest1, rest2 = s1 - per_checkpoint * k1, s2 - per_checkpoint * k2
    per_token = max((rest2 - rest1) / (t2 - t1), 0.0) if t2 > t1 else 0.0
    return SaveCost(max(rest1 - per_token * t1, 0.0), per_token, per_checkpoint)
