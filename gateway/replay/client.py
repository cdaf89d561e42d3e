"""Send one streamed chat request and measure it: TTFT, completion time, tokens, cache hits, backend.

TTFT is the wall time from sending to the first event with non-empty ``delta.content`` (or any other
delta text); completion time is the wall time to the end of the stream. Token counts come from the
final usage: llama.cpp ``timings`` (``cache_n`` cached, ``prompt_n + cache_n`` prompt,
``predicted_n`` completion) when present, else OpenAI ``usage`` (vLLM
``prompt_tokens_details.cached_tokens``). The backend is the gateway's ``x-turnout-backend`` header
(or the one the caller names when it sends straight to an engine).
"""

from __future__ import annotations

import asyncio
import json
import time
from dataclasses import dataclass
from typing import Any

import httpx


@dataclass(frozen=True, slots=True)
class Measured:
    """What one request did, in wall seconds since it was sent."""

    backend: str | None
    ttft: float | None
    duration: float
    prompt_tokens: int
    cached_tokens: int
    completion_tokens: int
    error: str | None = None


@dataclass
class _Usage:
    prompt: int = 0
    cached: int = 0
    completion: int = 0

    def take(self, obj: dict[str, Any]) -> None:
        timings = obj.get("timings")
        if isinstance(timings, dict) and "cache_n" in timings:
            self.cached = int(timings.get("cache_n") or 0)
            self.prompt = int(timings.get("prompt_n") or 0) + self.cached
            self.completion = int(timings.get("predicted_n") or 0)
            return
        usage = obj.get("usage")
        if isinstance(usage, dict):
            details = usage.get("prompt_tokens_details")
            self.prompt = int(usage.get("prompt_tokens") or 0)
            self.completion = int(usage.get("completion_tokens") or 0)
            if isinstance(details, dict):
                self.cached = int(details.get("cached_tokens") or 0)


def _has_text(obj: dict[str, Any]) -> bool:
    for choice in obj.get("choices") or ():
        delta = choice.get("delta") or {}
        if delta.get("content") or delta.get("reasoning_content") or delta.get("tool_calls"):
            return True
    return False


async def stream_chat(
    client: httpx.AsyncClient,
    url: str,
    body: dict[str, Any],
    headers: dict[str, str] | None = None,
    backend: str | None = None,
    responded: asyncio.Event | None = None,
) -> Measured:
    """POST ``body`` (streamed) to ``url`` and measure it (module docstring); never raises on HTTP errors.

    ``responded`` is set once the response headers arrived (or the request failed).
    """
    started = time.monotonic()
    first: float | None = None
    usage = _Usage()
    try:
        async with client.stream("POST", url, json=body, headers=headers) as response:
            if responded is not None:
                responded.set()
            backend = response.headers.get("x-turnout-backend") or backend
            if response.status_code != 200:
                text = (await response.aread()).decode(errors="replace")[:300]
                return Measured(
                    backend, None, time.monotonic() - started, 0, 0, 0, f"{response.status_code}: {text}"
                )
            async for line in response.aiter_lines():
                if not line.startswith("data: {"):
                    continue
                if first is None or '"usage"' in line or '"timings"' in line or '"error"' in line:
                    obj = json.loads(line[6:])
                    if "error" in obj:
                        return Measured(backend, None, time.monotonic() - started, 0, 0, 0, str(obj["error"]))
                    if first is None and _has_text(obj):
                        first = time.monotonic()
                    usage.take(obj)
    except httpx.HTTPError as exc:
        if responded is not None:
            responded.set()
        return Measured(backend, None, time.monotonic() - started, 0, 0, 0, f"{type(exc).__name__}: {exc}")
    ended = time.monotonic()
    return Measured(
        backend,
        None if first is None else first - started,
        ended - started,
        usage.prompt,
        usage.cached,
        usage.completion,
    )
