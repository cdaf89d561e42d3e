"""llama-server's RAM prompt cache (``--cache-ram``), as pure logic over token lists.

Follows ``server_prompt_cache`` (``tools/server/server-task.cpp``) and its callers in
``server-context.cpp``; ``shared/reference/engines.md`` A6/A7 has the summary.

* An **entry** is a slot's whole state: its tokens (prompt + generated), its context checkpoints and
  the state bytes. Its size is ``tokens * bytes_per_token + state_bytes`` plus ``state_bytes`` per
  checkpoint (a hybrid checkpoint holds the recurrent state; :class:`StateSizes`).
* **save** (``alloc``): skipped when an entry already contains the slot's tokens as a prefix, or when
  the state alone exceeds the limit; entries whose tokens are a prefix of the slot's are dropped; the
  oldest entries are dropped until the new one fits; it is appended (newest last).
* **load**: the entry with the best ``f_keep = LCP / len(entry)`` and ``f_sim = LCP / len(prompt)``,
  both strictly better than the slot's own (an empty slot's ``f_keep`` is -1), ignoring entries with
  ``f_keep < 0.25``. The winner replaces the slot's tokens and checkpoints and leaves the cache.
* **update** after each change: the oldest entries go while the size exceeds ``limit_bytes``, then
  while the cached tokens exceed ``max(limit_tokens, limit_bytes / bytes per cached token)``
  (``limit_tokens`` is the server's total context; ``--cache-ram -1`` has no byte limit, so the token
  limit alone applies).

When the server uses it (``get_available_slot`` and ``process_single_task``):

* a slot chosen by LRU, or by prompt similarity with ``f_keep = LCP / len(slot) < 0.5`` (a pinned
  ``id_slot`` counts as similarity 0 unless its own LCP is above the threshold), saves its state and
  then loads the best entry;
* with ``--cache-idle-slots`` (on by default) every idle slot is saved after each task launch (with a
  unified KV pool the idle slot is then cleared).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field

from backends.sim.prefix_cache import common_prefix

MIB = 1024 * 1024
KEEP_FLOOR = 0.25


@dataclass(frozen=True, slots=True)
class StateSizes:
    """Bytes of a saved slot state: per cached token (attention KV) and per recurrent state."""

    bytes_per_token: int = 64 * 1024
    state_bytes: int = 64 * MIB

    def entry_bytes(self, tokens: int, checkpoints: int) -> int:
        return tokens * self.bytes_per_token + self.state_bytes * (1 + checkpoints)


@dataclass(slots=True)
class CacheEntry:
    """One saved slot state."""

    tokens: list[int]
    checkpoints: tuple[int, ...]
    size: int


@dataclass(slots=True)
class RamCache:
    """The prompt cache of one server (module docstring); ``entries`` oldest first."""

    limit_bytes: int  # 0: no byte limit
    limit_tokens: int  # the server's total context
    sizes: StateSizes = field(default_factory=StateSizes)
    entries: list[CacheEntry] = field(default_factory=list)

    @classmethod
    def for_flag(cls, cache_ram_mib: int, n_ctx_total: int, sizes: StateSizes) -> RamCache | None:
        """The cache ``--cache-ram cache_ram_mib`` gives (None for 0: off; -1: no byte limit)."""
        if cache_ram_mib == 0:
            return None
        return cls(max(cache_ram_mib, 0) * MIB, n_ctx_total, sizes)

    @property
    def size(self) -> int:
        return sum(e.size for e in self.entries)

    @property
    def n_tokens(self) -> int:
        return sum(len(e.tokens) for e in self.entries)

    def save(self, tokens: Sequence[int], checkpoints: Sequence[int]) -> bool:
        """Store a slot's state (``alloc``); False when skipped."""
        if not tokens:
            return False
        if any(common_prefix(e.tokens, tokens) == len(tokens) for e in self.entries):
            return False
        size = self.sizes.entry_bytes(len(tokens), len(checkpoints))
        if self.limit_bytes and size > self.limit_bytes:
            return False
        self.entries = [e for e in self.entries if common_prefix(e.tokens, tokens) != len(e.tokens)]
        while self.entries and self.limit_bytes and self.size + size > self.limit_bytes:
            self.entries.pop(0)
        self.entries.append(CacheEntry(list(tokens), tuple(checkpoints), size))
        self.update()
        return True

    def best(self, slot_tokens: Sequence[int], prompt: Sequence[int]) -> CacheEntry | None:
        """The entry that beats the slot's own state for ``prompt`` (module docstring), left in place."""
        if not prompt:
            return None
        own = common_prefix(slot_tokens, prompt)
        keep_best = own / len(slot_tokens) if slot_tokens else -1.0
        sim_best = own / len(prompt)
        best: CacheEntry | None = None
        for entry in self.entries:
            lcp = common_prefix(entry.tokens, prompt)
            keep, sim = lcp / len(entry.tokens), lcp / len(prompt)
            if keep < KEEP_FLOOR:
                continue
            if keep_best < keep and sim_best < sim:
                keep_best, sim_best, best = keep, sim, entry
        return best

    def load(self, slot_tokens: Sequence[int], prompt: Sequence[int]) -> CacheEntry | None:
        """Take the :meth:`best` entry for ``prompt`` out of the cache (or None)."""
        entry = self.best(slot_tokens, prompt)
        if entry is not None:
            self.entries.remove(entry)
        self.update()
        return entry

    def update(self) -> None:
        """Drop the oldest entries beyond the byte limit, then beyond the token limit."""
        while self.entries and self.limit_bytes and self.size > self.limit_bytes:
            self.entries.pop(0)
        per_token = max(1.0, self.size / max(1, self.n_tokens))
        limit = (
            max(self.limit_tokens, int(self.limit_bytes / per_token))
            if self.limit_bytes
            else self.limit_tokens
        )
        if self.limit_tokens > 0:
            while self.entries and self.n_tokens > limit:
                self.entries.pop(0)
