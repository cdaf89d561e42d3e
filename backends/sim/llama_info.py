"""llama-server introspection bodies: ``/props``, ``/slots``, ``/v1/models`` and ``/metrics`` text.

Shapes follow ``get_res_props``, ``server_slot::to_json``, ``get_res_models`` (server-context.cpp) and
``server_task_result_metrics::to_metrics`` (server-task.cpp).
"""

from __future__ import annotations

from typing import Any

from backends.sim.llama_engine import LlamaEngine
from backends.sim.llama_slots import Slot
from backends.sim.llama_wire import BUILD_INFO
from backends.sim.tokenizer import END_OF_TEXT, IM_END, N_VOCAB

CHAT_TEMPLATE = (
    "{%- for message in messages %}{{- '<|im_start|>' + message.role + '\\n' + message.content + "
    "'<|im_end|>\\n' }}{%- endfor %}"
)
SAMPLERS = ["penalties", "dry", "top_n_sigma", "top_k", "typ_p", "top_p", "min_p", "xtc", "temperature"]


METRIC_HELP = {
    "prompt_tokens_total": "Number of prompt tokens processed, excluding cached tokens",
    "prompt_tokens_cached_total": "Number of prompt tokens reused from the cache",
    "prompt_seconds_total": "Total time spent processing prompts",
    "tokens_predicted_total": "Number of generation tokens processed",
    "tokens_predicted_seconds_total": "Total time spent generating tokens",
    "n_decode_total": "Total number of llama_decode() calls, excluding speculative decoding and multimodal "
    "decoding",
    "n_tokens_max": "Largest observed sequence length (prompt + generation)",
    "spec_decode_num_draft_tokens_total": "Speculative: Total draft tokens generated",
    "spec_decode_num_accepted_tokens_total": "Speculative: Total draft tokens accepted by the target model",
    "spec_decode_num_drafts_total": "Speculative: Total speculative decoding verification steps",
    "prompt_tokens_seconds": "Average prompt throughput in tokens/s",
    "predicted_tokens_seconds": "Average generation throughput in tokens/s",
    "requests_processing": "Number of requests processing",
    "requests_deferred": "Number of requests deferred",
    "n_busy_slots_per_decode": "Average number of busy slots per llama_decode() call",
}


def sampling_params(n_predict: int = -1, stream: bool = False) -> dict[str, Any]:
    """``task_params::to_json(only_metrics=true)`` with the server's default sampling settings."""
    return {
        "seed": 4294967295, "temperature": 0.8, "dynatemp_range": 0.0, "dynatemp_exponent": 1.0,
        "top_k": 40, "top_p": 0.95, "min_p": 0.05, "top_n_sigma": -1.0, "xtc_probability": 0.0,
        "xtc_threshold": 0.1, "typical_p": 1.0, "repeat_last_n": 64, "repeat_penalty": 1.0,
        "presence_penalty": 0.0, "frequency_penalty": 0.0, "dry_multiplier": 0.0, "dry_base": 1.75,
        "dry_allowed_length": 2, "dry_penalty_last_n": -1, "mirostat": 0, "mirostat_tau": 5.0,
        "mirostat_eta": 0.1, "adaptive_target": -1.0, "adaptive_decay": 0.9, "max_tokens": n_predict,
        "n_predict": n_predict, "n_keep": 0, "n_discard": 0, "ignore_eos": False, "stream": stream,
        "n_probs": 0, "min_keep": 0, "chat_format": "peg-native", "reasoning_format": "auto",
        "reasoning_in_content": False, "generation_prompt": "", "samplers": SAMPLERS,
        "speculative.types": "none", "timings_per_token": False, "post_sampling_probs": False,
        "backend_sampling": False, "lora": [],
    }  # fmt: skip


def props(engine: LlamaEngine) -> dict[str, Any]:
    """``GET /props``; ``n_ctx`` is the per-slot context."""
    config = engine.config
    return {
        "default_generation_settings": {"params": sampling_params(), "n_ctx": config.context_window},
        "total_slots": config.slots,
        "model_alias": config.model,
        "model_ftype": "Q4_K - Medium",
        "model_path": f"/models/{config.model}.gguf",
        "modalities": {"vision": False, "video": False, "audio": False},
        "media_marker": "<__media__>",
        "endpoint_slots": True,
        "endpoint_props": False,
        "endpoint_metrics": True,
        "ui": True,
        "ui_settings": {},
        "chat_template": CHAT_TEMPLATE,
        "chat_template_caps": {
            "supports_tools": True,
            "supports_tool_calls": True,
            "supports_system_role": True,
        },
        "bos_token": END_OF_TEXT,
        "eos_token": IM_END,
        "build_info": BUILD_INFO,
        "is_sleeping": False,
        "cors_proxy_enabled": False,
        "chat_template_tool_use": CHAT_TEMPLATE,
    }


def slot_json(slot: Slot) -> dict[str, Any]:
    """One ``/slots`` entry; task fields appear once the slot has run a task."""
    out: dict[str, Any] = {
        "id": slot.id,
        "n_ctx": slot.n_ctx,
        "speculative": False,
        "is_processing": slot.busy,
    }
    task = slot.task or slot.last_task
    if task is None:
        return out
    out["id_task"] = task.number
    out["n_prompt_tokens"] = len(slot.tokens)
    out["n_prompt_tokens_processed"] = len(task.prompt) - task.cached - task.prefill_left
    out["n_prompt_tokens_cache"] = task.cached
    n_predict = len(task.answer.tokens)
    out["params"] = sampling_params(n_predict)
    out["next_token"] = [
        {
            "has_next_token": slot.busy,
            "has_new_line": False,
            "n_remain": n_predict - task.n_emitted,
            "n_decoded": task.n_emitted,
        }
    ]
    return out


def models(engine: LlamaEngine) -> dict[str, Any]:
    """``GET /v1/models``: the ollama-style ``models`` list plus the OpenAI ``data`` list."""
    config = engine.config
    details = {
        "parent_model": "", "format": "gguf", "family": "", "families": [""], "parameter_size": "",
        "quantization_level": "",
    }  # fmt: skip
    ollama = {
        "name": config.model, "model": config.model, "modified_at": "", "size": "", "digest": "",
        "type": "model", "description": "", "tags": [""], "capabilities": ["completion"], "parameters": "",
        "details": details,
    }  # fmt: skip
    meta = {
        "vocab_type": 2, "n_vocab": N_VOCAB, "n_ctx": config.context_window, "n_ctx_train": 262144,
        "n_embd": 5120, "n_params": 27_000_000_000, "size": 16_600_000_000, "ftype": "Q4_K - Medium",
    }  # fmt: skip
    info = {
        "id": config.model,
        "aliases": [],
        "tags": [],
        "object": "model",
        "architecture": {"input_modalities": ["text"], "output_modalities": ["text"]},
        "created": int(engine.clock.time()),
        "owned_by": "llamacpp",
        "meta": meta,
    }
    return {"models": [ollama], "object": "list", "data": [info]}


def _fmt(value: float) -> str:
    """C++ ``std::stringstream << double`` (``%g``, 6 significant digits)."""
    return f"{float(value):g}"


def metrics_text(engine: LlamaEngine) -> str:
    """Prometheus text of ``/metrics`` (all names prefixed ``llamacpp:``)."""
    prompt_tps, predicted_tps = engine.take_bucket()
    counters = [
        ("prompt_tokens_total", engine.n_prompt_processed),
        ("prompt_tokens_cached_total", engine.n_prompt_cached),
        ("prompt_seconds_total", engine.prompt_seconds),
        ("tokens_predicted_total", engine.n_predicted),
        ("tokens_predicted_seconds_total", engine.predict_seconds),
        ("n_decode_total", engine.n_decode_calls),
        ("n_tokens_max", engine.n_tokens_max),
        ("spec_decode_num_draft_tokens_total", 0),
        ("spec_decode_num_accepted_tokens_total", 0),
        ("spec_decode_num_drafts_total", 0),
    ]
    gauges = [
        ("prompt_tokens_seconds", prompt_tps),
        ("predicted_tokens_seconds", predicted_tps),
        ("requests_processing", engine.n_processing),
        ("requests_deferred", len(engine.deferred)),
        ("n_busy_slots_per_decode", engine.n_busy_in_decode / max(engine.n_decode_calls, 1)),
    ]
    lines: list[str] = []
    for kind, items in (("counter", counters), ("gauge", gauges)):
        for name, value in items:
            doc = METRIC_HELP[name]
            full = f"llamacpp:{name}"
            lines.append(f"# HELP {full} {doc}\n# TYPE {full} {kind}\n{full} {_fmt(value)}\n")
    return "".join(lines)
