"""Parsers for vLLM's ``/metrics`` (prometheus text, ``vllm:`` names, labelled per model/engine)."""

from __future__ import annotations

from dataclasses import dataclass

from backends.parsers.prometheus import parse_samples, sum_by_name


@dataclass(frozen=True, slots=True)
class VllmMetrics:
    running: int
    waiting: int
    kv_cache_usage: float | None
    prefix_cache_queries: float | None
    prefix_cache_hits: float | None
    tokens_total: float | None = None  # prompt + generated tokens since the server started


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
    )


def _sum(totals: dict[str, float], *names: str) -> float | None:
    present = [totals[name] for name in names if name in totals]
    return sum(present) if present else None
