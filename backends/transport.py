"""The upstream HTTP transport: httpx's API over aiohttp's connection pool and C HTTP parser.

Adapters speak httpx (requests, ``httpx.Response``, ``httpx.HTTPError``); this transport carries the
bytes. The inference requests themselves skip httpx's request and response models (``post``: about
180 us of CPU per request and a few per streamed chunk, measured against aiohttp alone): their
answers are ``UpstreamResponse``, the part of ``httpx.Response`` the relay reads, and fail with the
same httpx exceptions.

httpx's own pool (httpcore) looks at every pooled connection for each request and parses HTTP in
Python: under the overhead harness it was over half of the gateway's CPU, and the CPU per request
grew with concurrency (1.45 ms at c1, 6 ms at c128). aiohttp's pool hands out a connection in
constant time and parses with llhttp; see docs/benchmarks.md ("Gateway overhead").

aiohttp's failures become the httpx exceptions the adapters already handle, by what they mean for
an engine: no connection (``ConnectError``), a connection the engine closed or reset before or
during its answer (``RemoteProtocolError``, ``ReadError``), a timeout (``ConnectTimeout``,
``ReadTimeout``, ``PoolTimeout``).

An engine that closes the connection before answering gets the request once more, on another
connection (a pooled one it was closing as the request went out), before it counts as a failure.

A response whose body was not read to its end closes its connection (the engine sees the client
leave and stops generating); one read to the end goes back to the pool.
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Iterator, Mapping, Sequence
from contextlib import contextmanager
from typing import Protocol

import aiohttp
import httpx


class UpstreamResponse(Protocol):
    """What the relay reads of an engine's answer: ``httpx.Response`` has it, and so does the
    transport's own (``AiohttpResponse``)."""

    @property
    def status_code(self) -> int: ...

    @property
    def headers(self) -> Mapping[str, str]: ...

    def aiter_bytes(self) -> AsyncIterator[bytes]: ...

    async def aread(self) -> bytes: ...

    async def aclose(self) -> None: ...


@contextmanager
def _as_httpx(request: httpx.Request | None, phase: str) -> Iterator[None]:
    """aiohttp's exceptions as httpx's (module docstring); ``phase``: connect or read."""
    try:
        yield
    except aiohttp.ConnectionTimeoutError as exc:
        raise httpx.ConnectTimeout(str(exc) or "connect timed out", request=request) from exc
    except TimeoutError as exc:  # aiohttp's socket read timeout, waiting for the headers or the body
        raise httpx.ReadTimeout(str(exc) or f"no answer ({phase})", request=request) from exc
    except aiohttp.ClientConnectorError as exc:
        raise httpx.ConnectError(str(exc), request=request) from exc
    except aiohttp.ServerDisconnectedError as exc:
        raise httpx.RemoteProtocolError(str(exc) or "server disconnected", request=request) from exc
    except (aiohttp.ClientPayloadError, aiohttp.ClientOSError) as exc:
        raise httpx.ReadError(str(exc) or "connection broken", request=request) from exc
    except aiohttp.ClientResponseError as exc:
        raise httpx.RemoteProtocolError(str(exc), request=request) from exc
    except aiohttp.ClientError as exc:
        raise httpx.ReadError(f"{type(exc).__name__}: {exc}", request=request) from exc


def _close(response: aiohttp.ClientResponse) -> None:
    """A body read to its end gives its connection back to the pool; any other closes it."""
    if response.content.at_eof():
        response.release()
    else:
        response.close()


def _unsent(exc: BaseException) -> bool:
    """Whether aiohttp failed to write the request at all: the connection it took from the pool was
    already closing ("Cannot write to closing transport"), so the engine never saw it."""
    return any(
        isinstance(cause, aiohttp.ClientConnectionResetError) and "closing transport" in str(cause)
        for cause in (exc, exc.__cause__)
    )


def _close_after_stream(response: aiohttp.ClientResponse) -> None:
    """llama-server (its cpp-httplib) closes the connection after every streamed answer, though the
    answer says ``Keep-Alive``: such a connection is not given back to the pool, where the next request
    could take it before its close is seen and fail ("Cannot write to closing transport")."""
    streamed = response.headers.get("Content-Type", "").startswith("text/event-stream")
    if not streamed or not response.headers.get("Server", "").startswith("llama.cpp"):
        return
    connection = response.connection
    if connection is not None:
        if connection.protocol is not None:
            connection.protocol.force_close()  # closed when the answer is read, not pooled
        return
    # the whole answer came with its headers (a short one, on a busy machine): aiohttp has already
    # given the connection back to the pool; close it there, so the pool drops it
    protocol = getattr(response, "_protocol", None)
    if protocol is not None:
        protocol.close()


class _Body(httpx.AsyncByteStream):
    def __init__(self, response: aiohttp.ClientResponse, request: httpx.Request) -> None:
        self._response = response
        self._request = request

    async def __aiter__(self) -> AsyncIterator[bytes]:
        with _as_httpx(self._request, "read"):
            async for chunk in self._response.content.iter_any():
                yield chunk

    async def aclose(self) -> None:
        _close(self._response)


class AiohttpResponse:
    """An engine's answer straight off aiohttp (``UpstreamResponse``)."""

    __slots__ = ("_response", "headers", "status_code")

    def __init__(self, response: aiohttp.ClientResponse) -> None:
        self._response = response
        self.status_code = response.status
        self.headers: Mapping[str, str] = response.headers

    async def aiter_bytes(self) -> AsyncIterator[bytes]:
        with _as_httpx(None, "read"):
            async for chunk in self._response.content.iter_any():
                yield chunk

    async def aread(self) -> bytes:
        with _as_httpx(None, "read"):
            return await self._response.read()

    async def aclose(self) -> None:
        _close(self._response)


UPSTREAM_KEEPALIVE_S = 2.0
"""How long an idle upstream connection is kept for reuse: under the engines' own keep-alive (5 s for
llama-server's cpp-httplib and for vLLM's uvicorn), so turnout never sends a request on a connection
the engine is closing at that moment (a "server disconnected" before any byte, which would cost the
request a retry on another backend and the session its warm slot)."""


class AiohttpTransport(httpx.AsyncBaseTransport):
    """An ``httpx.AsyncClient`` transport on one aiohttp session, opened on first use (in the loop
    that uses it). HTTP/1.1 only; no proxies from the environment (engines are on the local network)."""

    def __init__(self, limits: httpx.Limits | None = None) -> None:
        self._limits = limits or httpx.Limits()
        self._session: aiohttp.ClientSession | None = None

    def _open(self) -> aiohttp.ClientSession:
        connector = aiohttp.TCPConnector(
            limit=self._limits.max_connections or 0,
            limit_per_host=0,
            keepalive_timeout=min(
                self._limits.keepalive_expiry or UPSTREAM_KEEPALIVE_S, UPSTREAM_KEEPALIVE_S
            ),
        )
        self._session = aiohttp.ClientSession(
            connector=connector, auto_decompress=False, timeout=aiohttp.ClientTimeout(total=None)
        )
        return self._session

    async def _send(
        self,
        method: str,
        url: str,
        headers: Sequence[tuple[str, str]],
        content: bytes | None,
        timeouts: Mapping[str, float | None],
        request: httpx.Request | None = None,
    ) -> aiohttp.ClientResponse:
        session = self._session or self._open()
        timeout = aiohttp.ClientTimeout(
            total=None,
            connect=timeouts.get("pool"),
            sock_connect=timeouts.get("connect"),
            sock_read=timeouts.get("read"),
        )
        data = content or None

        async def attempt() -> aiohttp.ClientResponse:
            return await session.request(
                method, url, headers=headers, data=data, allow_redirects=False, compress=None, timeout=timeout
            )

        with _as_httpx(request, "connect"):
            try:
                response = await attempt()
            except (
                aiohttp.ServerDisconnectedError,
                aiohttp.ClientOSError,
                aiohttp.ClientConnectionResetError,
            ) as exc:
                if not isinstance(exc, aiohttp.ServerDisconnectedError) and not _unsent(exc):
                    raise
                # the engine closed the connection before any answer: a pooled one it was closing as
                # the request went out (its keep-alive running out on a busy machine, or llama-server
                # after a stream, below). Once more, on another connection; an engine that is really
                # gone fails this one too.
                response = await attempt()
        _close_after_stream(response)
        return response

    async def post(
        self, url: str, content: bytes, headers: Sequence[tuple[str, str]], timeouts: httpx.Timeout
    ) -> AiohttpResponse:
        """POST ``content`` and return the open answer once its headers are in (its body unread)."""
        return AiohttpResponse(await self._send("POST", url, headers, content, timeouts.as_dict()))

    async def handle_async_request(self, request: httpx.Request) -> httpx.Response:
        timeout = request.extensions.get("timeout", {})
        response = await self._send(
            request.method, str(request.url), request.headers.multi_items(), request.content, timeout, request
        )
        return httpx.Response(
            status_code=response.status,
            headers=response.raw_headers,
            stream=_Body(response, request),
            request=request,
            extensions={"http_version": b"HTTP/1.1"},
        )

    async def aclose(self) -> None:
        if self._session is not None:
            await self._session.close()
            self._session = None
