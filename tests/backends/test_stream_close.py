"""Closing the upstream response survives the caller's cancellation (the client left mid-stream)."""

from __future__ import annotations

import asyncio

import httpx

from backends.base import UpstreamRequest
from backends.stream import ResponseRelay


class SlowClose(httpx.AsyncByteStream):
    """An upstream body whose close takes a moment, like a socket shutdown."""

    def __init__(self) -> None:
        self.closed = False

    async def __aiter__(self):  # type: ignore[no-untyped-def]
        yield b"data: {}\n\n"

    async def aclose(self) -> None:
        await asyncio.sleep(0.05)
        self.closed = True


def test_a_close_cut_short_by_cancellation_still_closes_the_connection() -> None:
    """httpx marks a response closed before closing its stream: cancelling the first close halfway
    must not leave the connection open (the engine would generate to the end)."""

    async def main() -> bool:
        body = SlowClose()
        response = httpx.Response(200, stream=body, request=httpx.Request("POST", "http://127.0.0.1:9/v1/x"))
        relay = ResponseRelay(
            UpstreamRequest("vllm", "http://127.0.0.1:9/v1/x", b"{}", stream=True), response
        )
        closing = asyncio.ensure_future(relay.aclose())
        await asyncio.sleep(0.01)
        closing.cancel()  # the client left: the relay's finally is being cancelled
        await asyncio.gather(closing, return_exceptions=True)
        await relay.aclose()  # the later close (the background task) waits for the same one
        return body.closed

    assert asyncio.run(main())
