"""Prefix reuse rules of both engines, as pure functions over token lists (no time, no I/O).

llama.cpp (per slot, ``tools/server/server-context.cpp``):

* ``n_past = LCP(slot tokens incl. generated, prompt)``; with ``cache_prompt=false`` it is 0.
* dense/MoE: ``n_past`` is reused as is.
* hybrid (recurrent state cannot be rolled back): when the prompt only appends to the slot's tokens
  (``LCP == len(slot tokens) < len(prompt)``) the live state is reused; otherwise the newest context
  checkpoint with ``n_tokens <= LCP`` is restored (``n_past = n_tokens``), else a full re-prefill.
  Checkpoints past ``n_past`` are erased. Each processed prompt of length ``N`` adds checkpoints at
  ``max(n_past, N - gap)`` and ``max(n_past, N - 4)``, ``gap = min(n_batch, 4 + n_ubatch)`` (516 at
  the default micro-batch, 2,048 at compose's ``--ubatch-size 2048``: the engine profile's
  ``PrefillModel.checkpoint_gap``), and where its last user message starts when that is processed (the
  pinned ``server-context.cpp`` checkpoints the start of each step near the prompt's end, and ends a
  step there), at most 32 per slot, oldest evicted first.
* at least one prompt token is always evaluated: ``n_past <= len(prompt) - 1``.

vLLM (``BlockCache``): prompts are cut into full blocks whose hashes chain (``h_i = hash(h_{i-1}, block_i)``);
the hit is the run of leading blocks already stored, capped at ``(len(prompt) - 1) // block`` blocks so
at least one token is computed. Hybrid models in ``align`` mode use ``block_size``; dense use 16.
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Sequence
from dataclasses import dataclass

from policies.checkpoints import checkpoint_positions

MAX_CHECKPOINTS = 32


def common_prefix(a: Sequence[int], b: Sequence[int]) -> int:
    """Length of the longest common prefix of two token sequences."""
    n = min(len(a), len(b))
    if a[:n] == b[:n]:
        return n
    lo, hi = 0, n  # invariant: a[:lo] == b[:lo], a[:hi] != b[:hi]
    while hi - lo > 1:
        mid = (lo + hi) // 2
        if a[:mid] == b[:mid]:
            lo = mid
        else:
            hi = mid
    return lo


@dataclass(frozen=True, slots=True)
class SlotReuse:
    """How much of a slot's cache a new prompt reuses, and which checkpoints survive."""

    n_past: int
    checkpoints: tuple[int, ...]
    restored: int | None = None

    @property
    def restores(self) -> bool:
        """A context checkpoint is copied back before the prompt is processed (something reused)."""
        return self.restored is not None and self.n_past > 0


def llama_reuse(
    slot_tokens: Sequence[int],
    checkpoints: Sequence[int],
    prompt: Sequence[int],
    *,
    hybrid: bool,
    cache_prompt: bool = True,
) -> SlotReuse:
    """The reusable prefix of ``prompt`` in a llama.cpp slot (rules in the module docstring)."""
    if not cache_prompt or not prompt:
        return SlotReuse(0, ())
    lcp = common_prefix(slot_tokens, prompt)
    restored: int | None = None
    if not hybrid:
        n_past = lcp
        kept = tuple(checkpoints)
    else:
        if lcp == len(slot_tokens) and len(prompt) > lcp:
            n_past = lcp
        else:
            usable = [c for c in checkpoints if c <= lcp]
            n_past = usable[-1] if usable else 0
            restored = usable[-1] if usable else None
        kept = tuple(c for c in checkpoints if c <= n_past)
    return SlotReuse(min(n_past, len(prompt) - 1), kept, restored)


def add_checkpoints(
    checkpoints: Sequence[int],
    prompt_len: int,
    n_past: int,
    gap: int,
    user_start: int = -1,
    first_user: int = -1,
) -> tuple[int, ...]:
    """Checkpoints after processing a prompt of ``prompt_len`` tokens from position ``n_past``, the
    first near-end one ``gap`` tokens before its end (``PrefillModel.checkpoint_gap``): those kept,
    then those it takes (``policies.checkpoints.checkpoint_positions``; one at a position already
    held replaces it), the newest 32."""
    out = list(checkpoints)
    for pos in checkpoint_positions(prompt_len, n_past, gap, user_start, first_user):
        if pos in out:
            out.remove(pos)
        out.append(pos)
    return tuple(out[-MAX_CHECKPOINTS:])


def block_hashes(tokens: Sequence[int], block: int) -> list[int]:
    """Chained hashes of the full ``block``-token blocks of ``tokens``."""
    hashes: list[int] = []
    parent = 0
    for start in range(0, len(tokens) - block + 1, block):
        parent = hash((parent, tuple(tokens[start : start + block])))
        hashes.append(parent)
    return hashes


class BlockCache:
    """vLLM's prefix cache: a bounded LRU set of chained block hashes (see the module docstring)."""

    def __init__(self, block: int, capacity_blocks: int) -> None:
        self.block = block
        self.capacity_blocks = max(capacity_blocks, 1)
        self._blocks: OrderedDict[int, None] = OrderedDict()

    def hits(self, prompt: Sequence[int]) -> int:
        """Cached tokens for ``prompt``: leading stored blocks, leaving at least one token to compute."""
        if not prompt:
            return 0
        limit = (len(prompt) - 1) // self.block
        found = 0
        for h in block_hashes(prompt[: limit * self.block], self.block):
            if h not in self._blocks:
                break
            self._blocks.move_to_end(h)
            found += 1
        return found * self.block

    def insert(self, tokens: Sequence[int]) -> None:
        """Store every full block of ``tokens``, evicting the least recently used beyond capacity."""
        for h in block_hashes(tokens, self.block):
            self._blocks[h] = None
            self._blocks.move_to_end(h)
        while len(self._blocks) > self.capacity_blocks:
            self._blocks.popitem(last=False)

    def __len__(self) -> int:
        return len(self._blocks)
