"""llama-server's RAM prompt cache in the simulator: the cache's own rules, then the engine using it."""

from __future__ import annotations

import asyncio

import pytest

from backends.sim import SimConfig
from backends.sim.generation import Answer, DeltaKind, OutToken
from backends.sim.llama_engine import LlamaEngine
from backends.sim.ram_cache import MIB, RamCache, StateSizes
from backends.sim.task import SimTask, UpdateKind
from policies import Architecture

SIZES = StateSizes(bytes_per_token=1024, state_bytes=0)


def cache(limit_mib: int = 8192, limit_tokens: int = 1 << 20) -> RamCache:
    return RamCache(limit_mib * MIB, limit_tokens, SIZES)


class TestSave:
    def test_skips_a_state_already_contained(self) -> None:
        """A slot whose tokens are a prefix of a cached entry adds nothing."""
        ram = cache()
        assert ram.save([1, 2, 3, 4], ())
        assert not ram.save([1, 2, 3], ())
        assert [e.tokens for e in ram.entries] == [[1, 2, 3, 4]]

    def test_replaces_entries_it_contains(self) -> None:
        """An entry that is a prefix of the new state is obsolete and dropped."""
        ram = cache()
        ram.save([1, 2], ())
        ram.save([7, 8], ())
        ram.save([1, 2, 3], ())
        assert [e.tokens for e in ram.entries] == [[7, 8], [1, 2, 3]]

    def test_oldest_entries_make_room(self) -> None:
        """Over the byte limit the oldest entries go first."""
        ram = RamCache(3 * 1024, 1 << 20, SIZES)
        ram.save([1, 1], ())
        ram.save([2], ())
        ram.save([3, 3], ())
        assert [e.tokens for e in ram.entries] == [[2], [3, 3]]

    def test_an_entry_larger_than_the_limit_is_skipped(self) -> None:
        ram = RamCache(1024, 1 << 20, SIZES)
        assert not ram.save([1, 2], ())
        assert ram.entries == []

    def test_no_byte_limit_keeps_the_token_limit(self) -> None:
        """``--cache-ram -1``: no byte limit, but no more cached tokens than the server's context."""
        ram = RamCache.for_flag(-1, 4, SIZES)
        assert ram is not None
        ram.save([1, 1, 1], ())
        ram.save([2, 2], ())
        assert [e.tokens for e in ram.entries] == [[2, 2]]

    def test_checkpoints_count_in_the_size(self) -> None:
        """Each checkpoint of a hybrid slot holds one recurrent state."""
        sizes = StateSizes(bytes_per_token=10, state_bytes=1000)
        assert sizes.entry_bytes(100, 2) == 100 * 10 + 3 * 1000

    def test_zero_turns_it_off(self) -> None:
        assert RamCache.for_flag(0, 4096, SIZES) is None


class TestLoad:
    def test_best_entry_is_taken_out(self) -> None:
        """The entry sharing the most with the prompt wins and leaves the cache."""
        ram = cache()
        ram.save([1, 2, 3, 4], (2,))
        ram.save([1, 2, 9, 9], ())
        entry = ram.load([7, 7, 7], [1, 2, 3, 4, 5])
        assert entry is not None
        assert (entry.tokens, entry.checkpoints) == ([1, 2, 3, 4], (2,))
        assert [e.tokens for e in ram.entries] == [[1, 2, 9, 9]]

    def test_must_beat_the_slot(self) -> None:
        """An entry no better than what the slot holds is not loaded."""
        ram = cache()
        ram.save([1, 2, 3], ())
        assert ram.load([1, 2, 3, 4], [1, 2, 3, 4, 5]) is None

    def test_ignores_entries_it_would_mostly_discard(self) -> None:
        """f_keep below 0.25 (a long entry sharing a short prefix) is never loaded."""
        ram = cache()
        ram.save([1, *range(100, 110)], ())
        assert ram.load([], [1, 2, 3]) is None

    def test_empty_slot_takes_any_useful_entry(self) -> None:
        ram = cache()
        ram.save([1, 2], ())
        entry = ram.load([], [1, 2, 3])
        assert entry is not None
        assert entry.tokens == [1, 2]


def run_turns(config: SimConfig, turns: list[tuple[list[int], int]]) -> list[int]:
    """Run each (prompt, id_slot) to completion, one after the other; the cached tokens of each."""

    async def main() -> list[int]:
        engine = LlamaEngine(config)
        await engine.start()
        cached = []
        try:
            for number, (prompt, id_slot) in enumerate(turns):
                answer = Answer((OutToken(7, "x", DeltaKind.TEXT),), "length", None)
                task = SimTask(id=f"t{number}", prompt=prompt, answer=answer, id_slot=id_slot)
                engine.submit(task)
                while (await task.outbox.get()).kind is not UpdateKind.DONE:
                    pass
                cached.append(task.cached)
        finally:
            await engine.stop()
        return cached

    return asyncio.run(main())


@pytest.mark.parametrize("cache_ram_mib", [8192, 0])
def test_three_conversations_over_two_slots(cache_ram_mib: int) -> None:
    """A slot given to another conversation saves its state to RAM; pinning brings it back."""
    a, b, c = ([base + i for i in range(300)] for base in (1000, 2000, 3000))
    config = SimConfig(
        kind="llamacpp",
        slots=2,
        context_window=4096,
        architecture=Architecture.HYBRID,
        time_scale=0.0,
        cache_ram_mib=cache_ram_mib,
    )
    a1, b1 = a + [5] * 40, b + [6] * 40
    cached = run_turns(config, [(a, 0), (b, 1), (c, 0), (a1, 1), (b1, 0)])
    if cache_ram_mib:
        assert cached == [0, 0, 0, 300, 300]
    else:
        assert cached == [0, 0, 0, 0, 0]
