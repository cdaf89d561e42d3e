"""The engine's answer as Envoy passes it through the picker: read by the relay's own reader
(``backends.stream.ResponseRelay``: usage, the first token's time, the model name the client asked
by, the usage chunk turnout asked for removed, an Anthropic client's answer translated), and sent
back to Envoy: chunk by chunk in FULL_DUPLEX_STREAMED mode, whole in BUFFERED mode."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Awaitable, Callable, Mapping
from typing import Any

from backends.base import UpstreamRequest
from backends.errors import UpstreamStreamError
from backends.fleet import Fleet
from backends.stream import ResponseRelay
from gateway.epp import wire
from gateway.errors import UpstreamFailed, stream_error_event

Write = Callable[[Any], Awaitable[None]]
Settle = Callable[[str | None, int | None], Awaitable[None]]
"""The exchange's settling: the error (None: answered) and the status, if the answer changed it."""


class EnvoyResponse:
    """The engine's answer as Envoy passes it: the ``UpstreamResponse`` the relay's reader reads,
    its body fed chunk by chunk (``feed``; None ends it)."""

    def __init__(self, status: int, headers: Mapping[str, str]) -> None:
        self._status, self._headers = status, headers
        self._chunks: asyncio.Queue[bytes | None] = asyncio.Queue()

    @property
    def status_code(self) -> int:
        return self._status

    @property
    def headers(self) -> Mapping[str, str]:
        return self._headers

    def feed(self, chunk: bytes | None) -> None:
        self._chunks.put_nowait(chunk)

    async def aiter_bytes(self) -> AsyncIterator[bytes]:
        while (chunk := await self._chunks.get()) is not None:
            if chunk:
                yield chunk

    async def aread(self) -> bytes:
        return b"".join([chunk async for chunk in self.aiter_bytes()])

    async def aclose(self) -> None:
        """Nothing to close: Envoy owns the connection."""


class Answer:
    """One 2xx answer on its way back (module docstring). ``feed`` Envoy's body chunks; ``run``
    (a task) writes the replies, and settles the request before the last one: Envoy may close the
    stream as soon as it has it."""

    def __init__(
        self,
        upstream: UpstreamRequest,
        response: EnvoyResponse,
        fleet: Fleet,
        write: Write,
        *,
        buffered: bool,
        api: str,
        anthropic: bool,
        answered_by: str | None = None,
    ) -> None:
        self.upstream, self.response, self.fleet, self.write = upstream, response, fleet, write
        self.answered_by = answered_by or upstream.backend_id  # a fallback's, if the data plane fell back
        self.relay = ResponseRelay(upstream, response, fleet.clock.monotonic)
        self.buffered, self.api, self.anthropic = buffered, api, anthropic
        self._held: list[bytes] = []  # BUFFERED mode: the whole answer goes back at once

    def feed(self, chunk: bytes, end: bool) -> None:
        self.response.feed(chunk)
        if end:
            self.response.feed(None)

    async def _send(self, data: bytes, end: bool) -> None:
        if self.buffered:
            self._held.append(data)
            if end:
                await self.write(wire.whole_body("response_body", b"".join(self._held)))
            return
        for reply in wire.body("response_body", data, end):
            await self.write(reply)

    async def run(self, settle: Settle, prefilled: Callable[[], None]) -> None:
        relay, upstream, fleet = self.relay, self.upstream, self.fleet
        tail, status, error = b"", None, None
        try:
            if upstream.stream:
                first = True
                async for events in relay.events():
                    if first and relay.first_token_at is not None:
                        first = False
                        prefilled()  # its prompt is processed: no backlog
                    await self._send(events, False)
            else:
                tail = await relay.body()
            fleet.judge(self.answered_by, None)
        except UpstreamStreamError as exc:
            error = exc.message
            fleet.judge(self.answered_by, exc.message)
            failed = UpstreamFailed(f"backend {self.answered_by} failed: {exc.message}")
            if upstream.stream:
                tail = stream_error_event(self.api, failed)
            else:
                status = failed.status
                tail = failed.anthropic_body() if self.anthropic else failed.openai_body()
        await settle(error, status)
        await self._send(tail, True)
