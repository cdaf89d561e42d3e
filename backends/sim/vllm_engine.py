"""Simulated vLLM V1 engine core: an unbounded waiting queue, up to ``max_num_seqs`` running, a block cache.

Admission is FIFO into the running batch. On admission the request's cached prefix is looked up in
the block cache (``prefix_cache.BlockCache``; none when prefix caching is off); when its prompt is done
its full prompt blocks are stored, and when it finishes the full blocks of prompt + output are.
Counters follow ``vllm/v1/metrics/loggers.py``: ``prompt_tokens`` counts whole prompts,
``prefix_cache_queries`` / ``prefix_cache_hits`` count queried / hit tokens.
"""

from __future__ import annotations

from collections import Counter, deque

from backends.clock import WALL, Clock
from backends.sim.config import SimConfig
from backends.sim.engine_base import BatchEngine
from backends.sim.events import EventKind
from backends.sim.prefix_cache import BlockCache
from backends.sim.sleep_state import SleepState
from backends.sim.task import SimTask


class VllmEngine(BatchEngine):
    """The vLLM scheduler + engine core (see the module docstring)."""

    def __init__(self, config: SimConfig, *, clock: Clock = WALL) -> None:
        super().__init__(config, clock=clock)
        self.kv_pool_tokens = config.kv_pool_tokens
        block = config.cache_block_size
        self.cache: BlockCache | None = (
            BlockCache(block, self.kv_pool_tokens // block) if config.prefix_caching else None
        )
        self.waiting: deque[SimTask] = deque()
        self.created = clock.time()
        self.prompt_tokens_total = 0
        self.prompt_tokens_cached_total = 0
        self.generation_tokens_total = 0
        self.prefix_cache_queries = 0
        self.prefix_cache_hits = 0
        self.request_success: Counter[str] = Counter()
        self.sleep_state: SleepState | None = SleepState() if config.enable_sleep_mode else None
        """Where the weights and KV cache are (``backends.sim.vllm_sleep``); None without sleep mode."""

    def submit(self, task: SimTask) -> None:
        """Queue a validated request."""
        self.waiting.append(task)
        self.wake()

    def admit(self) -> None:
        """Move waiting requests into the batch while fewer than ``max_num_seqs`` run."""
        while self.waiting and len(self.running) < self.config.max_num_seqs:
            task = self.waiting.popleft()
            task.cached = self.cache.hits(task.prompt) if self.cache is not None else 0
            if self.cache is not None:
                self.prefix_cache_queries += len(task.prompt)
                self.prefix_cache_hits += task.cached
            self.begin(task)

    def remove_waiting(self, task: SimTask) -> None:
        """Abort a queued request."""
        if task in self.waiting:
            self.waiting.remove(task)

    def on_prompt_done(self, task: SimTask) -> None:
        """Store the prompt's blocks and count its tokens (vLLM counts prompts at the first token)."""
        if self.cache is not None:
            self.cache.insert(task.prompt)
        self.prompt_tokens_total += len(task.prompt)
        self.prompt_tokens_cached_total += task.cached

    def on_end(self, task: SimTask, kind: EventKind) -> None:
        """Store the blocks of what the request computed and count it: its prompt and its output but
        the last token, which was sampled and never fed back (measured on vLLM 0.25: the next turn
        reuses ``floor((prompt + generated - 1) / block)`` blocks, 42 of 42 turns)."""
        self.generation_tokens_total += task.n_emitted
        if kind is EventKind.FINISH:
            if self.cache is not None:
                self.cache.insert(task.prompt + [t.id for t in task.generated][:-1])
            reason = task.answer.finish_reason
            self.request_success["stop" if reason == "tool_calls" else reason] += 1
        else:
            self.request_success["abort"] += 1

    def created_cache_tokens(self, task: SimTask) -> int:
        """Prompt tokens this request newly wrote to the prefix cache (``created_cache_tokens``):
        its prompt's whole blocks minus the cached ones (vLLM's ``PrefillStats.finalize``)."""
        if self.cache is None:
            return 0
        block = self.cache.block
        return max(0, len(task.prompt) // block * block - task.cached)

    @property
    def kv_cache_usage(self) -> float:
        """Fraction of the KV pool held by running requests (prompt + generated tokens)."""
        used = sum(len(t.prompt) - t.prefill_left + t.n_emitted for t in self.running)
        return min(used / self.kv_pool_tokens, 1.0)
