"""Pure prefix-reuse rules: llama.cpp slots and checkpoints, vLLM block hashing, slot choice."""

from __future__ import annotations

from backends.sim.generation import Answer
from backends.sim.llama_slots import Slot, SlotChoice, pick_deferred, select_slot
from backends.sim.prefix_cache import BlockCache, add_checkpoints, common_prefix, llama_reuse
from backends.sim.task import SimTask


def _task(id_slot: int = -1) -> SimTask:
    return SimTask(id="t", prompt=[1], answer=Answer((), "stop", None), id_slot=id_slot)


class TestCommonPrefix:
    def test_lengths(self) -> None:
        """LCP of equal, diverging and disjoint sequences."""
        assert common_prefix([1, 2, 3], [1, 2, 3, 4]) == 3
        assert common_prefix([1, 2, 3, 4], [1, 2, 9, 4]) == 2
        assert common_prefix([5], [1]) == 0
        assert common_prefix(list(range(1000)), [*range(700), 0]) == 700


class TestLlamaReuse:
    def test_dense_reuses_lcp(self) -> None:
        """Dense: n_past = LCP."""
        assert llama_reuse([1, 2, 3, 4], (), [1, 2, 3, 9, 9], hybrid=False).n_past == 3

    def test_at_least_one_token_evaluated(self) -> None:
        """An identical prompt still evaluates its last token."""
        assert llama_reuse([1, 2, 3], (), [1, 2, 3], hybrid=False).n_past == 2

    def test_hybrid_append_reuses_everything(self) -> None:
        """Hybrid: a prompt that only appends reuses the live state."""
        assert llama_reuse([1, 2, 3], (), [1, 2, 3, 4, 5], hybrid=True).n_past == 3

    def test_hybrid_divergence_restores_checkpoint(self) -> None:
        """Hybrid: divergence inside the cache restores the newest checkpoint <= LCP, dropping later ones."""
        slot = list(range(100))
        reuse = llama_reuse(slot, (20, 60, 96), [*range(80), -1], hybrid=True)
        assert (reuse.n_past, reuse.restored, reuse.checkpoints) == (60, 60, (20, 60))

    def test_hybrid_divergence_without_checkpoint_reprocesses(self) -> None:
        """Hybrid: no usable checkpoint means a full re-prefill."""
        assert llama_reuse(list(range(100)), (90,), [*range(50), -1], hybrid=True).n_past == 0

    def test_cache_prompt_false(self) -> None:
        """cache_prompt=false reuses nothing."""
        assert llama_reuse([1, 2, 3], (), [1, 2, 3, 4], hybrid=False, cache_prompt=False).n_past == 0

    def test_checkpoints_near_prompt_end(self) -> None:
        """A prompt of N tokens processed from n_past adds max(n_past, N - 516) and max(n_past, N - 4)
        (each step near the end is checkpointed as it starts; the real server's trace of a 300-token
        turn after 1,024 cached: 1,024 and 1,320); at most 32 are kept."""
        assert add_checkpoints((), 1000, 0, 516) == (484, 996)
        assert add_checkpoints((), 1000, 990, 516) == (990, 996)
        assert add_checkpoints((), 1324, 1024, 516) == (1024, 1320)
        assert add_checkpoints((), 1000, 997, 516) == (997,)
        assert add_checkpoints((), 100, 0, 516) == (96,)
        many = tuple(range(1, 40))
        assert len(add_checkpoints(many, 5000, 0, 516)) == 32

    def test_the_gap_follows_the_micro_batch_and_the_last_user_message_is_checkpointed(self) -> None:
        """At --ubatch-size 2048 (--batch-size 2048) the near-end step starts 2,048 tokens before the
        end (``EngineProfile.checkpoint_gap``); a chat's last user message start is checkpointed when
        it is processed (``server-context.cpp`` ends a step there)."""
        assert add_checkpoints((), 5000, 0, gap=2048) == (2952, 4996)
        assert add_checkpoints((), 1082, 0, gap=2048) == (1078,)
        assert add_checkpoints((), 1082, 0, gap=2048, user_start=10) == (10, 1078)
        assert add_checkpoints((), 1495, 1078, gap=2048, user_start=1350) == (1078, 1350, 1491)
        assert add_checkpoints((), 1495, 1078, gap=2048, user_start=900) == (1078, 1491)  # reused


class TestBlockCache:
    def test_block_aligned_hits(self) -> None:
        """Only whole leading blocks hit, leaving at least one token to compute."""
        cache = BlockCache(256, 100)
        first = list(range(600))
        assert cache.hits(first) == 0
        cache.insert(first)
        assert cache.hits([*first, *range(1000, 1100)]) == 512
        assert cache.hits(first[:512]) == 256
        assert cache.hits([*range(100), *range(2000, 2600)]) == 0

    def test_lru_eviction(self) -> None:
        """Capacity bounds the stored blocks."""
        cache = BlockCache(16, 4)
        cache.insert(list(range(160)))
        assert len(cache) == 4


class TestSlotChoice:
    def test_fresh_server_picks_highest_id(self) -> None:
        """LRU ties go to the highest-numbered slot."""
        slots = [Slot(i, 100) for i in range(3)]
        assert select_slot(slots, [1, 2, 3], -1).slot is slots[2]

    def test_similarity_beats_lru(self) -> None:
        """An idle slot sharing > 10% of the prompt wins."""
        slots = [Slot(0, 100, tokens=[9] * 10), Slot(1, 100, tokens=[1, 2, 3, 4], t_last_used=5)]
        assert select_slot(slots, [1, 2, 3, 4, 5], -1) == SlotChoice(slots[1], update_cache=False)

    def test_pinned_even_when_busy(self) -> None:
        """id_slot is taken modulo the slot count and returned busy or not."""
        slots = [Slot(0, 100, task=_task()), Slot(1, 100)]
        assert select_slot(slots, [1], 2) == SlotChoice(slots[0], update_cache=False)

    def test_all_busy(self) -> None:
        """No idle slot: None (the task is deferred)."""
        slots = [Slot(0, 100, task=_task())]
        assert select_slot(slots, [1], -1).slot is None

    def test_lru_choice_updates_the_ram_cache(self) -> None:
        """A slot chosen by LRU saves its state and loads the best RAM entry."""
        slots = [Slot(0, 100, tokens=[9] * 10), Slot(1, 100)]
        assert select_slot(slots, [1, 2, 3], -1).update_cache

    def test_similar_slot_keeping_half_does_not_update(self) -> None:
        """Similarity above the threshold with f_keep >= 0.5 reuses the slot as it is."""
        slots = [Slot(0, 100, tokens=[1, 2, 3, 4])]
        assert not select_slot(slots, [1, 2, 3, 4, 5], -1).update_cache

    def test_similar_slot_keeping_less_than_half_updates(self) -> None:
        """f_keep = LCP / len(slot) < 0.5: the slot's state is saved before it is overwritten."""
        slots = [Slot(0, 100, tokens=[1, 2, 9, 9, 9, 9, 9, 9])]
        assert select_slot(slots, [1, 2, 3], -1).update_cache

    def test_pinned_slot_of_another_conversation_updates(self) -> None:
        """A pinned idle slot sharing nothing with the prompt counts as f_keep 0: update."""
        slots = [Slot(0, 100, tokens=[9, 9, 9]), Slot(1, 100)]
        assert select_slot(slots, [1, 2, 3], 0) == SlotChoice(slots[0], update_cache=True)

    def test_pinned_empty_slot_does_not_update(self) -> None:
        """An empty pinned slot: f_keep is 0/0 (NaN), so the RAM cache is not consulted."""
        slots = [Slot(0, 100)]
        assert not select_slot(slots, [1, 2, 3], 0).update_cache

    def test_deferred_pinned_first(self) -> None:
        """A freed slot takes a task pinned to it before the oldest."""
        queue = [_task(), _task(1), _task(0)]
        assert pick_deferred(queue, 0) == 2
        assert pick_deferred(queue, 3) == 0
        assert pick_deferred([], 0) is None
