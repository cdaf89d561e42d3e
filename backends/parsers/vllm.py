"""Parsers for vLLM's ``/metrics`` (prometheus text, ``vllm:`` names, labelled per model/engine)."""

from __future__ import annotations

from dataclasses import dataclass

from backends.parsers.prometheus import Sample, parse_samples, sum_by_name


@dataclass(frozen=True, slots=True)
class VllmMetrics:
    running: int
    waiting: int
    kv_cache_usage: float | None
    prefix_cache_queries: float | None
    prefix_cache_hits: float | None
    tokens_total: float | None = None  # prompt + generated tokens since the server started
    cache_block: int | None = None
    """Tokens its prefix cache hits come in (``vllm:cache_config_info``); None: prefix caching off, or
    not reported."""
    cache_tokens: int | None = None
    """Tokens its KV cache holds, the prefix cache's bound (``vllm:cache_config_info``); None: prefix
    caching off, or not reported."""


def parse_metrics(text: str) -> VllmMetrics:
    """Load and prefix-cache counters, summed over engines and models.

    ``kv_cache_usage`` is the largest value over engines (0-1). Older servers named it
    ``vllm:gpu_cache_usage_perc``; both are read.
    """
    samples = parse_samples(text)
    totals = sum_by_name(samples)
    kv_values = [
        s.value for s in samples if s.name in ("vllm:kv_cache_usage_perc", "vllm:gpu_cache_usage_perc")
    ]
    return VllmMetrics(
        running=int(totals.get("vllm:num_requests_running", 0)),
        waiting=int(totals.get("vllm:num_requests_waiting", 0)),
        kv_cache_usage=max(kv_values) if kv_values else None,
        prefix_cache_queries=totals.get("vllm:prefix_cache_queries_total"),
        prefix_cache_hits=totals.get("vllm:prefix_cache_hits_total"),
        tokens_total=_sum(totals, "vllm:prompt_tokens_total", "vllm:generation_tokens_total"),
        cache_block=_cache_block(samples),
        cache_tokens=_cache_tokens(samples),
    )


BLOCK_LABELS = ("block_size", "effective_attention_block_size", "cache_hit_alignment_tokens")
"""``vllm:cache_config_info`` labels a prefix cache hit may be a multiple of (vLLM caches whole blocks;
a hybrid model's attention block may be set larger than configured, and cache hits may be aligned to
more tokens still)."""


def _cache_config(samples: list[Sample]) -> dict[str, str] | None:
    """``vllm:cache_config_info``'s labels when prefix caching is on; None when off, or not reported."""
    for sample in samples:
        if sample.name == "vllm:cache_config_info":
            labels = dict(sample.labels)
            return labels if labels.get("enable_prefix_caching") == "True" else None
    return None


def _cache_block(samples: list[Sample]) -> int | None:
    """The largest of :data:`BLOCK_LABELS` that is a number, when prefix caching is on. The largest:
    what turnout learns of the hits can only lower it (a greatest common divisor), never raise it."""
    labels = _cache_config(samples) or {}
    sizes = [int(labels[name]) for name in BLOCK_LABELS if labels.get(name, "").isdigit()]
    return max(sizes) if sizes and max(sizes) > 0 else None


def _cache_tokens(samples: list[Sample]) -> int | None:
    """``kv_cache_size_tokens`` where the server says it (newer vLLM: what its KV cache holds, a hybrid
    model's layers counted), else ``num_gpu_blocks * block_size``; when prefix caching is on."""
    labels = _cache_config(samples) or {}
    size = labels.get("kv_cache_size_tokens", "")
    if size.isdigit() and int(size) > 0:
        return int(size)
    blocks, block = labels.get("num_gpu_blocks", ""), labels.get("block_size", "")
    if blocks.isdigit() and block.isdigit() and int(blocks) * int(block) > 0:
        return int(blocks) * int(block)
    return None


def _sum(totals: dict[str, float], *names: str) -> float | None:
    present = [totals[name] for name in names if name in totals]
    return sum(present) if present else None
