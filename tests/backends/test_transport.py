"""The aiohttp transport, both ways the gateway uses it (under an httpx client, and ``post``, the
inference requests' direct path): streaming as it arrives, connections reused or closed, and every
way an engine can fail surfacing as the httpx exception the adapters handle."""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable, Sequence
from typing import Any

import httpx
import pytest

from backends.base import BackendSpec, HttpxPoster, Poster, UpstreamRequest
from backends.registry import create_adapter
from backends.transport import AiohttpTransport, UpstreamResponse
from policies import EngineKind

Handler = Callable[[asyncio.StreamReader, asyncio.StreamWriter], Awaitable[None]]
TIMEOUTS = httpx.Timeout(30.0)
"""Only bounds a hung test: no test below waits for these to fire (the one that does sets its own)."""


async def _request(reader: asyncio.StreamReader) -> bytes:
    head = await reader.readuntil(b"\r\n\r\n")
    length = next(
        (
            int(line.split(b":")[1])
            for line in head.split(b"\r\n")
            if line.lower().startswith(b"content-length")
        ),
        0,
    )
    return head + await reader.readexactly(length)


@pytest.fixture(params=["httpx", "direct"])
def way(request: pytest.FixtureRequest) -> str:
    """Through ``httpx.AsyncClient`` (probes, token counts) or ``AiohttpTransport.post`` (inference)."""
    return str(request.param)


def serve(handler: Handler, way: str, check: Callable[[Poster, str], Awaitable[Any]]) -> Any:
    """Run ``check`` with a poster on the transport against a raw server on a loopback port."""

    async def main() -> Any:
        server = await asyncio.start_server(handler, "127.0.0.1", 0)
        port = server.sockets[0].getsockname()[1]
        transport = AiohttpTransport()
        async with server, httpx.AsyncClient(transport=transport, timeout=TIMEOUTS) as client:
            poster: Poster = HttpxPoster(client) if way == "httpx" else transport
            return await check(poster, f"http://127.0.0.1:{port}")

    return asyncio.run(main())


async def _post(poster: Poster, url: str, timeouts: httpx.Timeout = TIMEOUTS) -> UpstreamResponse:
    return await poster.post(url, b"{}", [("content-type", "application/json")], timeouts)


def test_a_stream_arrives_as_the_server_sends_it_and_the_connection_is_reused(way: str) -> None:
    sent = asyncio.Event()
    connections: list[int] = []

    async def handler(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        connections.append(1)
        for _ in range(2):
            await _request(reader)
            writer.write(
                b"HTTP/1.1 200 OK\r\ncontent-type: text/event-stream\r\ntransfer-encoding: chunked\r\n\r\n"
            )
            writer.write(b"6\r\nfirst\n\r\n")
            await writer.drain()
            await sent.wait()  # the second part only once the client has the first
            sent.clear()
            writer.write(b"7\r\nsecond\n\r\n0\r\n\r\n")
            await writer.drain()
        writer.close()

    async def check(poster: Poster, url: str) -> list[list[bytes]]:
        bodies = []
        for _ in range(2):
            parts = []
            response = await _post(poster, url + "/v1/chat/completions")
            assert (response.status_code, response.headers["content-type"]) == (200, "text/event-stream")
            async for chunk in response.aiter_bytes():
                parts.append(chunk)
                if len(parts) == 1:
                    sent.set()
            await response.aclose()
            bodies.append(parts)
        return bodies

    assert serve(handler, way, check) == [[b"first\n", b"second\n"]] * 2
    assert len(connections) == 1  # kept alive: the second request reused it


def test_a_stream_left_unread_closes_its_connection(way: str) -> None:
    """The client left mid-stream: the engine must see the connection go (and stop generating)."""
    closed = asyncio.Event()

    async def handler(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        await _request(reader)
        writer.write(b"HTTP/1.1 200 OK\r\ntransfer-encoding: chunked\r\n\r\n6\r\nfirst\n\r\n")
        await writer.drain()
        assert await reader.read() == b""  # EOF: the gateway closed the connection
        closed.set()

    async def check(poster: Poster, url: str) -> bool:
        response = await _post(poster, url)
        async for _ in response.aiter_bytes():
            break
        await response.aclose()
        await asyncio.wait_for(closed.wait(), 30)
        return closed.is_set()

    assert serve(handler, way, check)


async def _close_at_once(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
    await _request(reader)
    writer.close()


async def _reset_mid_body(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
    await _request(reader)
    writer.write(b"HTTP/1.1 200 OK\r\ncontent-length: 100\r\n\r\npart")
    await writer.drain()
    writer.transport.abort()  # RST, like an engine killed mid-answer


async def _silent(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
    await _request(reader)
    await reader.read()  # until the client gives up


@pytest.mark.parametrize(
    ("handler", "expected", "timeouts"),
    [
        (_close_at_once, httpx.RemoteProtocolError, httpx.Timeout(5.0)),
        (_reset_mid_body, httpx.ReadError, httpx.Timeout(5.0)),
        # only the read timeout is short: the engine never answers, so it is what must fire
        (_silent, httpx.ReadTimeout, httpx.Timeout(5.0, read=0.3)),
    ],
    ids=["closed-before-answering", "reset-mid-body", "silent"],
)
def test_engine_failures_are_httpx_errors(
    handler: Handler, expected: type[httpx.HTTPError], timeouts: httpx.Timeout, way: str
) -> None:
    async def check(poster: Poster, url: str) -> type[BaseException]:
        try:
            response = await _post(poster, url, timeouts)
            await response.aread()
        except httpx.HTTPError as exc:
            return type(exc)
        raise AssertionError("no error")

    assert serve(handler, way, check) is expected


def test_nothing_listening_is_a_connect_error(way: str) -> None:
    async def check(poster: Poster, url: str) -> None:
        with pytest.raises(httpx.ConnectError):
            await _post(poster, "http://127.0.0.1:9/v1/chat/completions")

    serve(_silent, way, check)


def test_a_body_read_to_its_end_gives_the_connection_back(way: str) -> None:
    """A whole non-streamed answer, read with ``aread``: the next request reuses the connection."""
    connections: list[int] = []

    async def handler(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        connections.append(1)
        while not reader.at_eof():
            try:
                await _request(reader)
            except asyncio.IncompleteReadError:
                break
            writer.write(b"HTTP/1.1 200 OK\r\ncontent-type: application/json\r\ncontent-length: 2\r\n\r\n{}")
            await writer.drain()

    async def check(poster: Poster, url: str) -> list[bytes]:
        bodies = []
        for _ in range(3):
            response = await _post(poster, url)
            bodies.append(await response.aread())
            await response.aclose()
        return bodies

    assert serve(handler, way, check) == [b"{}"] * 3
    assert len(connections) == 1


class _Recorder:
    """A poster that records the timeouts each request was sent with and answers 200."""

    def __init__(self) -> None:
        self.timeouts: list[httpx.Timeout] = []

    async def post(
        self, url: str, content: bytes, headers: Sequence[tuple[str, str]], timeouts: httpx.Timeout
    ) -> UpstreamResponse:
        self.timeouts.append(timeouts)
        return httpx.Response(200, content=b"{}")


def test_a_stream_has_no_socket_read_timer_and_a_whole_answer_has_the_backstop() -> None:
    """A stream is read under the watchdog; aiohttp would re-arm a read timer on every chunk."""
    recorder = _Recorder()
    spec = BackendSpec("b", EngineKind.OPENAI, "http://127.0.0.1:9", read_timeout=100.0, connect_timeout=3.0)
    adapter = create_adapter(spec, httpx.AsyncClient(), recorder)
    for stream in (True, False):
        request = UpstreamRequest("b", "http://127.0.0.1:9/v1/chat/completions", b"{}", stream)
        asyncio.run(adapter.send(request))
    stream_timeouts, whole = recorder.timeouts
    assert (stream_timeouts.read, stream_timeouts.connect, stream_timeouts.pool) == (None, 3.0, 105.0)
    assert (whole.read, whole.connect) == (105.0, 3.0)


ENGINE_KEEPALIVE_S = 5.0  # cpp-httplib's CPPHTTPLIB_KEEPALIVE_TIMEOUT_SECOND, uvicorn's timeout_keep_alive


def test_an_idle_connection_is_not_reused_after_the_keepalive(way: str) -> None:
    """An engine closes idle connections after 5 s (llama-server, uvicorn); turnout lets go of them
    after ``UPSTREAM_KEEPALIVE_S``, so a request never races the engine's close on a stale one."""
    connections: list[int] = []

    async def handler(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        connections.append(1)
        try:
            while True:
                await _request(reader)
                writer.write(b"HTTP/1.1 200 OK\r\ncontent-length: 2\r\n\r\n{}")
                await writer.drain()
        except (asyncio.IncompleteReadError, ConnectionError):
            writer.close()

    async def check(poster: Poster, url: str) -> None:
        for pause in (
            0.0,
            0.0,
            ENGINE_KEEPALIVE_S - 1.5,
        ):  # idle longer than turnout keeps, shorter than engines
            await asyncio.sleep(pause)
            response = await _post(poster, url + "/health")
            await response.aread()
            await response.aclose()

    serve(handler, way, check)
    assert len(connections) == 2  # the first two requests shared one; the one after the pause a new one
