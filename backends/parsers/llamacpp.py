"""Parsers for llama-server's ``/metrics``, ``/slots``, ``/props`` and ``/health``."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from backends.parsers.prometheus import parse_samples, sum_by_name
from policies.types import SlotState


@dataclass(frozen=True, slots=True)
class LlamaMetrics:
    processing: int
    deferred: int
    prompt_tokens: float | None
    prompt_tokens_cached: float | None
    decode_calls: float | None = None  # llama_decode() calls since the server started


@dataclass(frozen=True, slots=True)
class LlamaProps:
    total_slots: int
    n_ctx: int | None  # per slot
    model_alias: str | None


def parse_metrics(text: str) -> LlamaMetrics:
    """``llamacpp:requests_processing`` (busy slots) and ``requests_deferred`` (queued tasks)."""
    totals = sum_by_name(parse_samples(text))
    return LlamaMetrics(
        processing=int(totals.get("llamacpp:requests_processing", 0)),
        deferred=int(totals.get("llamacpp:requests_deferred", 0)),
        prompt_tokens=totals.get("llamacpp:prompt_tokens_total"),
        prompt_tokens_cached=totals.get("llamacpp:prompt_tokens_cached_total"),
        decode_calls=totals.get("llamacpp:n_decode_total"),
    )


def parse_slots(data: Any) -> tuple[SlotState, ...]:
    """``GET /slots``: a JSON array, one object per slot."""
    if not isinstance(data, list):
        raise ValueError("not a /slots response: expected a JSON array")
    slots = []
    for item in data:
        if isinstance(item, Mapping) and isinstance(item.get("id"), int):
            slots.append(
                SlotState(
                    id=item["id"],
                    n_ctx=_int(item.get("n_ctx")) or 0,
                    is_processing=bool(item.get("is_processing", False)),
                    task=_int(item.get("id_task")),
                    tokens=_int(item.get("n_prompt_tokens")),
                )
            )
    return tuple(slots)


def _int(value: Any) -> int | None:
    return value if isinstance(value, int) and not isinstance(value, bool) else None


def parse_props(data: Any) -> LlamaProps:
    """``GET /props``: slot count and the per-slot context window."""
    if not isinstance(data, Mapping) or not isinstance(data.get("total_slots"), int):
        raise ValueError("not a /props response: no integer 'total_slots'")
    settings = data.get("default_generation_settings")
    n_ctx = settings.get("n_ctx") if isinstance(settings, Mapping) else None
    alias = data.get("model_alias")
    return LlamaProps(
        total_slots=data["total_slots"],
        n_ctx=n_ctx if isinstance(n_ctx, int) else None,
        model_alias=alias if isinstance(alias, str) else None,
    )


def is_loading(status: int, data: Any) -> bool:
    """llama-server answers every path with 503 "Loading model" until its model is loaded."""
    if status != 503 or not isinstance(data, Mapping):
        return False
    error = data.get("error")
    return isinstance(error, Mapping) and error.get("message") == "Loading model"
