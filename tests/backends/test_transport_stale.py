"""An engine that closes the connection before answering (a pooled connection whose keep-alive it was
ending as the request went out) costs the request nothing: the transport sends it once more, on
another connection. One that never answers still fails, as a protocol error."""

from __future__ import annotations

import asyncio

import httpx
import pytest

from backends.transport import AiohttpTransport

ANSWER = b"HTTP/1.1 200 OK\r\ncontent-type: application/json\r\ncontent-length: 2\r\n\r\n{}"


async def serve(closes_first: int) -> tuple[asyncio.Server, list[int]]:
    """A loopback server that reads each request and closes the first ``closes_first`` connections
    unanswered, then answers."""
    connections: list[int] = []

    async def handle(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        connections.append(len(connections))
        await reader.readuntil(b"\r\n\r\n")
        await reader.readexactly(2)  # the body: {}
        if len(connections) > closes_first:
            writer.write(ANSWER)
            await writer.drain()
        writer.close()

    server = await asyncio.start_server(handle, "127.0.0.1", 0)
    return server, connections


async def post(closes_first: int) -> tuple[int, int]:
    server, connections = await serve(closes_first)
    port = server.sockets[0].getsockname()[1]
    transport = AiohttpTransport()
    try:
        response = await transport.post(f"http://127.0.0.1:{port}/v1/chat", b"{}", [], httpx.Timeout(5.0))
        body = await response.aread()
        assert body == b"{}"
        return response.status_code, len(connections)
    finally:
        await transport.aclose()
        server.close()
        await server.wait_closed()


def test_a_connection_closed_before_the_answer_is_tried_once_more() -> None:
    assert asyncio.run(post(closes_first=1)) == (200, 2)


def test_an_engine_that_never_answers_still_fails() -> None:
    with pytest.raises(httpx.RemoteProtocolError):
        asyncio.run(post(closes_first=5))
