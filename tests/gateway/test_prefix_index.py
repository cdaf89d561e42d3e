"""The prefix index's memory: what docs/routing.md promises per tracked token."""

from __future__ import annotations

import gc
import random
import tracemalloc

from gateway.state.prefix_index import PrefixIndex
from policies.prefix import CHUNK_BYTES, chain_of

CHARS_PER_TOKEN = 3.6


def test_a_tracked_token_costs_well_under_a_byte() -> None:
    """20 prompts of 100 kB (~28k tokens each) on two slots: measured ~0.3 byte per token; no text kept."""
    rng = random.Random(0)
    prompts = [rng.randbytes(100_000) for _ in range(20)]
    index = PrefixIndex(max_tokens_per_backend=10**9)
    gc.collect()
    tracemalloc.start()
    try:
        before = tracemalloc.take_snapshot()
        for number, prompt in enumerate(prompts):
            index.record(
                "llama", number % 2, chain_of(prompt), round(len(prompt) / CHARS_PER_TOKEN), f"s{number}"
            )
        gc.collect()
        grown = sum(stat.size_diff for stat in tracemalloc.take_snapshot().compare_to(before, "filename"))
    finally:
        tracemalloc.stop()
    tokens = sum(len(p) for p in prompts) / CHARS_PER_TOKEN
    assert grown / tokens < 0.5
    assert grown < sum(len(p) for p in prompts) / 10  # hashes, not text
    assert grown / (len(prompts) * (100_000 // CHUNK_BYTES)) < 130  # bytes per chunk
