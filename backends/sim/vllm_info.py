"""vLLM introspection bodies: ``/v1/models`` and the Prometheus ``/metrics`` text.

Metric names and help texts follow ``vllm/v1/metrics/loggers.py``; the exposition mimics
``prometheus_client.generate_latest``: counters get ``_total`` plus a ``_created`` gauge family, labels
are ``model_name`` then ``engine``, values are printed like Go floats (``0.0``, ``1.7e+09``).
"""

from __future__ import annotations

import secrets
from typing import Any

from backends.sim.vllm_engine import VllmEngine

FINISH_REASONS = ("stop", "length", "abort", "error")


def models(engine: VllmEngine) -> dict[str, Any]:
    """``ModelList`` with one ``ModelCard`` (``max_model_len``, ``owned_by: vllm``, a permission entry)."""
    config = engine.config
    now = int(engine.clock.time())
    permission = {
        "id": f"modelperm-{secrets.token_hex(16)}", "object": "model_permission", "created": now,
        "allow_create_engine": False, "allow_sampling": True, "allow_logprobs": True,
        "allow_search_indices": False, "allow_view": True, "allow_fine_tuning": False, "organization": "*",
        "group": None, "is_blocking": False,
    }  # fmt: skip
    card = {
        "id": config.model, "object": "model", "created": now, "owned_by": "vllm", "root": config.model,
        "parent": None, "max_model_len": config.context_window, "permission": [permission],
    }  # fmt: skip
    return {"object": "list", "data": [card]}


def go_float(value: float) -> str:
    """``prometheus_client.utils.floatToGoString``."""
    d = float(value)
    s = repr(d)
    dot = s.find(".")
    if d > 0 and dot > 6:
        mantissa = f"{s[0]}.{s[1:dot]}{s[dot + 1 :]}".rstrip("0.")
        return f"{mantissa}e+0{dot - 1}"
    return s


def _family(name: str, doc: str, kind: str, samples: list[tuple[str, float]]) -> str:
    lines = [f"# HELP {name} {doc}\n# TYPE {name} {kind}\n"]
    lines += [f"{name}{{{labels}}} {go_float(value)}\n" for labels, value in samples]
    return "".join(lines)


def metrics_text(engine: VllmEngine) -> str:
    """The ``vllm:`` metric families the gateway reads (gauges, then counters with ``_created``)."""
    base = f'model_name="{engine.config.model}",engine="0"'
    gauges = [
        ("vllm:num_requests_running", "Number of requests in model execution batches.", len(engine.running)),
        ("vllm:num_requests_waiting", "Number of requests waiting to be processed.", len(engine.waiting)),
        ("vllm:kv_cache_usage_perc", "KV-cache usage. 1 means 100 percent usage.", engine.kv_cache_usage),
    ]
    counters = [
        ("vllm:prefix_cache_queries", "Prefix cache queries, in terms of number of queried tokens.",
         engine.prefix_cache_queries),
        ("vllm:prefix_cache_hits", "Prefix cache hits, in terms of number of cached tokens.",
         engine.prefix_cache_hits),
        ("vllm:num_preemptions", "Cumulative number of preemption from the engine.", 0),
        ("vllm:prompt_tokens", "Number of prefill tokens processed.", engine.prompt_tokens_total),
        ("vllm:prompt_tokens_cached", "Number of cached prompt tokens (local + external).",
         engine.prompt_tokens_cached_total),
        ("vllm:generation_tokens", "Number of generation tokens processed.", engine.generation_tokens_total),
    ]  # fmt: skip
    out = [_family(name, doc, "gauge", [(base, value)]) for name, doc, value in gauges]
    for name, doc, value in counters:
        out.append(_family(f"{name}_total", doc, "counter", [(base, value)]))
        out.append(_family(f"{name}_created", doc, "gauge", [(base, engine.created)]))
    config = engine.config
    pool = engine.kv_pool_tokens
    cache = (
        f'block_size="{config.cache_block_size}",enable_prefix_caching="{config.prefix_caching}",'
        f'num_gpu_blocks="{pool // max(config.cache_block_size, 1)}",kv_cache_size_tokens="{pool}"'
    )
    doc = "Information of the LLMEngine CacheConfig"
    out.append(_family("vllm:cache_config_info", doc, "gauge", [(cache, 1.0)]))
    success = [(f'{base},finished_reason="{r}"', float(engine.request_success[r])) for r in FINISH_REASONS]
    doc = "Count of successfully processed requests."
    out.append(_family("vllm:request_success_total", doc, "counter", success))
    out.append(
        _family("vllm:request_success_created", doc, "gauge", [(s[0], engine.created) for s in success])
    )
    return "".join(out)
