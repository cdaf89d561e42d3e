"""vLLM adapter: asks for streamed usage, reads load and prefix-cache counters from /metrics."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, ClassVar

from msgspec.structs import replace

from backends.base import Adapter
from backends.parsers.vllm import parse_metrics
from policies.types import BackendSnapshot, Deployment, Endpoint, EngineKind, Health


class VllmAdapter(Adapter):
    """vLLM's OpenAI server.

    Streams carry usage only with ``stream_options.include_usage``; turnout needs it, so it asks
    for it and removes the extra usage chunk again when the client did not ask.
    """

    kind: ClassVar[EngineKind] = EngineKind.VLLM

    def rewrite_body(
        self, endpoint: Endpoint, body: dict[str, Any], deployment: Deployment, slot: int | None
    ) -> bool:
        if not body.get("stream") or endpoint not in (Endpoint.CHAT, Endpoint.COMPLETIONS):
            return False  # Messages and Responses streams always carry usage
        options = body.get("stream_options")
        if isinstance(options, dict) and options.get("include_usage"):
            return False
        body["stream_options"] = {**(options if isinstance(options, dict) else {}), "include_usage": True}
        return True

    async def count_tokens(
        self, endpoint: Endpoint, body: Mapping[str, Any], deployment: Deployment
    ) -> int | None:
        """``POST /tokenize`` with the messages (chat template applied) or the prompt."""
        payload: dict[str, Any] = {"model": deployment.upstream_name}
        if endpoint is Endpoint.CHAT:
            payload |= {"messages": body.get("messages"), "add_generation_prompt": True}
            if body.get("tools"):
                payload["tools"] = body["tools"]
        elif isinstance(body.get("prompt"), str):
            payload["prompt"] = body["prompt"]
        else:
            return None
        data = await self._post_json("/tokenize", payload)
        count = data.get("count") if isinstance(data, dict) else None
        return count if isinstance(count, int) else None

    async def probe_engine(self, base: BackendSnapshot) -> BackendSnapshot:
        if self.spec.sleeps:  # a member of a residency set: asleep is down, whoever put it to sleep
            status, data = await self._get("/is_sleeping")
            if status < 400 and isinstance(data, dict) and data.get("is_sleeping") is True:
                return replace(base, health=Health.DOWN, error="asleep (vLLM sleep mode)")
        metrics = parse_metrics(str(await self._get_ok("/metrics")))
        return replace(
            base,
            running=metrics.running,
            queued=metrics.waiting,
            kv_usage=metrics.kv_cache_usage,
            prefix_cache_queries=metrics.prefix_cache_queries,
            prefix_cache_hits=metrics.prefix_cache_hits,
            work_done=metrics.tokens_total,
            cache_block=metrics.cache_block,
            cache_tokens=metrics.cache_tokens,
        )
