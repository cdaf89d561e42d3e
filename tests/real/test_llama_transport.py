"""The relay's transport against a real llama-server, which closes the connection after every streamed
answer though the answer says ``Keep-Alive: timeout=5, max=100`` (its cpp-httplib): the next request
never goes down that connection, and one that would is sent again on a new one."""

from __future__ import annotations

import asyncio
import json
from typing import Any

import aiohttp
import httpx
import pytest

from backends import transport
from backends.transport import AiohttpTransport
from tests.real.llama_server import LlamaServerFactory

pytestmark = [pytest.mark.real_llama, pytest.mark.timeout(300)]

ROUNDS = 10
HEADERS = [("content-type", "application/json")]


def body(stream: bool) -> bytes:
    return json.dumps(
        {"messages": [{"role": "user", "content": "hi"}], "max_tokens": 4, "stream": stream}
    ).encode()


def rounds(url: str, monkeypatch: pytest.MonkeyPatch) -> tuple[list[int], int, int]:
    """``ROUNDS`` of a streamed answer then a plain request at once, on one transport: each answer's
    status, how many requests aiohttp was asked to send, and how many streamed answers' connections
    went back into the pool, where the next request could take them (aiohttp's connector: its
    ``_conns``). A busy machine's llama-server also closes some plain answers' connections (a request
    it serves on one of its per-request threads), and the request that takes one is rightly sent again:
    the sends alone cannot tell that from a stream's connection reused."""
    sent = 0
    request = aiohttp.ClientSession.request

    def counted(self: aiohttp.ClientSession, *args: Any, **kwargs: Any) -> Any:
        nonlocal sent
        sent += 1
        return request(self, *args, **kwargs)

    monkeypatch.setattr(aiohttp.ClientSession, "request", counted)

    async def run() -> tuple[list[int], int]:
        relay, statuses, pooled = AiohttpTransport(), [], 0
        try:
            for _ in range(ROUNDS):
                streamed = await relay.post(url, body(True), HEADERS, httpx.Timeout(30))
                # the connection it came on (a short answer may have come whole with its headers,
                # its connection back in the pool already)
                protocol = streamed._response._protocol
                assert protocol is not None
                async for _chunk in streamed.aiter_bytes():
                    pass
                await streamed.aclose()
                assert relay._session is not None
                pool = relay._session.connector._conns  # type: ignore[union-attr]
                pooled += any(p is protocol and p.is_connected() for conns in pool.values() for p, _ in conns)
                plain = await relay.post(url, body(False), HEADERS, httpx.Timeout(30))
                await plain.aread()
                await plain.aclose()
                statuses += [streamed.status_code, plain.status_code]
        finally:
            await relay.aclose()
        return statuses, pooled

    statuses, pooled = asyncio.run(run())
    return statuses, sent, pooled


def test_no_request_follows_a_stream_down_its_closed_connection(
    llama_server: LlamaServerFactory, monkeypatch: pytest.MonkeyPatch
) -> None:
    server = llama_server()
    statuses, _, pooled = rounds(f"{server.base_url}/v1/chat/completions", monkeypatch)
    assert statuses == [200] * 2 * ROUNDS
    assert pooled == 0  # no streamed answer's connection was left open in the pool


def test_a_request_that_met_a_closed_connection_is_sent_again(
    llama_server: LlamaServerFactory, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Were the streamed answers' connections pooled (as before), a request that takes one fails to
    write ("Cannot write to closing transport"), never reaching the engine: it goes again, on a new
    connection, and the client gets its answer."""
    server = llama_server()
    monkeypatch.setattr(transport, "_close_after_stream", lambda response: None)
    statuses, sent, pooled = rounds(f"{server.base_url}/v1/chat/completions", monkeypatch)
    assert statuses == [200] * 2 * ROUNDS
    assert pooled > 0  # the streamed answers' connections went back to the pool, open...
    assert sent > 2 * ROUNDS  # ...and some request took one closing, and went again


def test_only_a_request_never_written_is_sent_again() -> None:
    closing = aiohttp.ClientConnectionResetError("Cannot write to closing transport")
    unwritten = aiohttp.ClientOSError(None, "Can not write request body")
    unwritten.__cause__ = closing
    assert transport._unsent(closing)
    assert transport._unsent(unwritten)
    assert not transport._unsent(aiohttp.ClientOSError(104, "Connection reset by peer"))
