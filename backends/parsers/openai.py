"""Parsers for the OpenAI-compatible parts every engine shares: model lists and usage."""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from policies.types import Usage


@dataclass(frozen=True, slots=True)
class ServedModel:
    """One entry of ``/v1/models``: the name the engine answers to and its context window, if given."""

    id: str
    context_window: int | None


def _int(value: Any) -> int | None:
    return value if isinstance(value, int) and not isinstance(value, bool) else None


def _ms(value: Any) -> float | None:
    """A finite number of milliseconds; None for anything else (a JSON integer may be too large for
    a float: msgspec decodes integers of up to 4300 digits)."""
    if not isinstance(value, int | float) or isinstance(value, bool):
        return None
    try:
        number = float(value)
    except OverflowError:
        return None
    return number if math.isfinite(number) else None


def parse_models(data: Any) -> tuple[ServedModel, ...]:
    """``/v1/models`` of vLLM (``max_model_len``), llama.cpp (``meta.n_ctx``, per slot) or others."""
    if not isinstance(data, Mapping) or not isinstance(data.get("data"), list):
        raise ValueError("not a /v1/models response: no 'data' list")
    models: list[ServedModel] = []
    for item in data["data"]:
        if not isinstance(item, Mapping) or not isinstance(item.get("id"), str):
            continue
        window = _int(item.get("max_model_len"))
        meta = item.get("meta")
        if window is None and isinstance(meta, Mapping):
            window = _int(meta.get("n_ctx"))
        models.append(ServedModel(item["id"], window))
    return tuple(models)


def _input_output_usage(usage: Mapping[str, Any]) -> Usage:
    """Anthropic (``input_tokens`` excludes ``cache_read_input_tokens``) or Responses
    (``input_tokens`` includes ``input_tokens_details.cached_tokens``) usage."""
    input_tokens = _int(usage.get("input_tokens")) or 0
    output_tokens = _int(usage.get("output_tokens")) or 0
    cache_read = _int(usage.get("cache_read_input_tokens"))
    if cache_read is not None:
        created = _int(usage.get("cache_creation_input_tokens")) or 0
        return Usage(input_tokens + cache_read + created, output_tokens, cache_read)
    details = usage.get("input_tokens_details")
    cached = _int(details.get("cached_tokens")) if isinstance(details, Mapping) else None
    return Usage(input_tokens, output_tokens, cached)


def parse_usage(data: Mapping[str, Any]) -> Usage | None:
    """Usage from a response or a stream event, in any of the APIs turnout relays.

    OpenAI ``usage`` plus llama.cpp ``timings``; llama.cpp's ``timings`` alone is enough
    (``prompt_n + cache_n`` prompt tokens, ``predicted_n`` completion tokens): on a stream without
    ``include_usage`` it is all there is. Anthropic ``usage`` (also inside ``message_start``'s
    ``message``) and Responses ``usage`` (also inside ``response.completed``'s ``response``).
    """
    for wrapper in ("message", "response"):
        inner = data.get(wrapper)
        if isinstance(inner, Mapping) and isinstance(inner.get("usage"), Mapping):
            data = inner
    usage = data.get("usage")
    if isinstance(usage, Mapping) and ("input_tokens" in usage or "output_tokens" in usage):
        return _input_output_usage(usage)
    timings = data.get("timings")
    timings = timings if isinstance(timings, Mapping) else {}
    prompt_ms = _ms(timings.get("prompt_ms"))
    predicted_ms = _ms(timings.get("predicted_ms"))
    cache_n = _int(timings.get("cache_n"))
    if isinstance(usage, Mapping):
        details = usage.get("prompt_tokens_details")
        cached = _int(details.get("cached_tokens")) if isinstance(details, Mapping) else None
        return Usage(
            prompt_tokens=_int(usage.get("prompt_tokens")) or 0,
            completion_tokens=_int(usage.get("completion_tokens")) or 0,
            cached_tokens=cached if cached is not None else cache_n,
            prompt_ms=prompt_ms,
            predicted_ms=predicted_ms,
        )
    prompt_n = _int(timings.get("prompt_n"))
    if prompt_n is None:
        return None
    return Usage(
        prompt_tokens=prompt_n + (cache_n or 0),
        completion_tokens=_int(timings.get("predicted_n")) or 0,
        cached_tokens=cache_n,
        prompt_ms=prompt_ms,
        predicted_ms=predicted_ms,
    )
