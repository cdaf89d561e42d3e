"""A deliberately misbehaving OpenAI-compatible upstream, for the failure paths of the relay.

It answers probes like a healthy server and fails chat requests in the way it is told to:
an error status and body, or a stream that breaks off after a few events.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from typing import Any

from litestar import Litestar, Request, Response, get, post
from litestar.response import Stream


@dataclass
class Fault:
    status: int = 200
    body: bytes = b""
    events_before_break: int | None = None  # stream this many events, then drop the connection
    hang: bool = False  # accept the request, never answer (not even headers)
    stall_after: int | None = None  # stream this many events, then stay silent with the connection open
    running: int = 0  # what /metrics (vLLM's names) reports as running
    media_type: str = "application/json"  # of the answer with ``status`` and ``body``
    events_then_end: int | None = None  # stream this many events, then end without [DONE]
    garbage: bytes = b""  # sent after the first event of an ``events_then_end`` stream
    calls: list[bytes] = field(default_factory=list)


CHUNK = (
    b'data: {"id":"x","object":"chat.completion.chunk","model":"up-faulty",'
    b'"choices":[{"index":0,"delta":{"content":"hi"}}]}\n\n'
)


def create_faulty_app(fault: Fault, model: str = "up-faulty") -> Litestar:
    @get("/health")
    async def health() -> Response[bytes]:
        return Response(b"", status_code=200)

    @get("/v1/models")
    async def models() -> dict[str, Any]:
        return {"object": "list", "data": [{"id": model, "object": "model"}]}

    @get("/metrics", media_type="text/plain")
    async def metrics() -> str:
        return f"vllm:num_requests_running {fault.running}\nvllm:num_requests_waiting 0\n"

    @post(["/v1/chat/completions", "/v1/messages", "/v1/responses"])
    async def chat(request: Request[Any, Any, Any]) -> Response[Any]:
        fault.calls.append(await request.body())
        if fault.hang:
            await asyncio.Event().wait()  # until the gateway gives up and the connection closes
        if fault.stall_after is not None:

            async def stalling() -> AsyncIterator[bytes]:
                for _ in range(fault.stall_after or 0):
                    yield CHUNK
                await asyncio.Event().wait()
                yield b""  # pragma: no cover

            return Stream(stalling(), media_type="text/event-stream")
        if fault.events_then_end is not None:

            async def unfinished() -> AsyncIterator[bytes]:
                for index in range(fault.events_then_end or 0):
                    yield CHUNK
                    if index == 0 and fault.garbage:
                        await asyncio.sleep(0.05)  # a read of its own
                        yield fault.garbage

            return Stream(unfinished(), media_type="text/event-stream")
        if fault.events_before_break is None:
            return Response(fault.body, status_code=fault.status, media_type=fault.media_type)

        async def events() -> AsyncIterator[bytes]:
            for _ in range(fault.events_before_break or 0):
                yield CHUNK
                await asyncio.sleep(0.01)
            raise ConnectionResetError("upstream died")

        return Stream(events(), media_type="text/event-stream")

    return Litestar([health, models, metrics, chat], debug=False)
