"""vLLM adapter: asks for streamed usage, reads load and prefix-cache counters from /metrics."""

from __future__ import annotations

from dataclasses import replace
from typing import Any, ClassVar

from backends.base import Adapter
from backends.parsers.vllm import parse_metrics
from policies.types import BackendSnapshot, Deployment, EngineKind


class VllmAdapter(Adapter):
    """vLLM's OpenAI server.

    Streams carry usage only with ``stream_options.include_usage``; turnout needs it, so it asks
    for it and removes the extra usage chunk again when the client did not ask.
    """

    kind: ClassVar[EngineKind] = EngineKind.VLLM

    def rewrite_body(self, body: dict[str, Any], deployment: Deployment, slot: int | None) -> bool:
        if not body.get("stream"):
            return False
        options = body.get("stream_options")
        if isinstance(options, dict) and options.get("include_usage"):
            return False
        body["stream_options"] = {**(options if isinstance(options, dict) else {}), "include_usage": True}
        return True

    async def probe_engine(self, base: BackendSnapshot) -> BackendSnapshot:
        metrics = parse_metrics(str(await self._get_ok("/metrics")))
        return replace(
            base,
            running=metrics.running,
            queued=metrics.waiting,
            kv_usage=metrics.kv_cache_usage,
            prefix_cache_queries=metrics.prefix_cache_queries,
            prefix_cache_hits=metrics.prefix_cache_hits,
        )
