"""Relaying an engine's response: SSE events through as they arrive, usage read on the way.

The hot path touches bytes only: complete events are forwarded as the engine sent them, in the
read that completed them. JSON is decoded only for the one or two events that carry ``usage`` or
``timings``. The documented rewrites are the model name (to the name the client asked for) and
the removal of a usage chunk that turnout itself asked for.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator, Callable
from dataclasses import replace
from typing import Any

import httpx
import msgspec

from backends.anthropic_chat import StreamTranslator, to_message
from backends.base import UpstreamRequest
from backends.errors import UpstreamStreamError
from backends.parsers.openai import parse_usage
from policies.types import Usage

_USAGE_MARKERS = (b'"usage"', b'"timings"')
_EMPTY_CHOICES = b'"choices":[]'


def _boundary(buffer: bytes) -> int:
    """Index just past the last complete SSE event in ``buffer`` (0 when there is none)."""
    lf = buffer.rfind(b"\n\n")
    crlf = buffer.rfind(b"\r\n\r\n")
    return max(lf + 2 if lf >= 0 else 0, crlf + 4 if crlf >= 0 else 0)


def _event_json(event: bytes) -> Any:
    data = b"".join(line[5:].lstrip() for line in event.splitlines() if line.startswith(b"data:"))
    if not data or data == b"[DONE]":
        return None
    try:
        return msgspec.json.decode(data)
    except msgspec.DecodeError:
        return None


def broke_off(backend_id: str, what: str, exc: httpx.HTTPError) -> UpstreamStreamError:
    """A response that broke off; the engine is ``gone`` when the connection closed or reset under it."""
    gone = isinstance(exc, (httpx.RemoteProtocolError, httpx.ReadError, httpx.ConnectError))
    detail = "the engine closed the connection" if gone else type(exc).__name__
    return UpstreamStreamError(backend_id, f"{what} broke off: {detail}", gone=gone)


def merge_usage(previous: Usage | None, new: Usage | None) -> Usage | None:
    """Anthropic streams split usage: input in ``message_start``, output in ``message_delta``."""
    if new is None or previous is None:
        return new or previous
    if new.prompt_tokens == 0 and previous.prompt_tokens > 0:
        cached = new.cached_tokens if new.cached_tokens is not None else previous.cached_tokens
        return replace(new, prompt_tokens=previous.prompt_tokens, cached_tokens=cached)
    return new


class ResponseRelay:
    """Forwards one upstream response and records what routing learns from it.

    ``first_byte_at`` (monotonic) marks the first body bytes (time to first token for streams),
    ``usage`` the last usage/timings seen.
    """

    def __init__(
        self,
        request: UpstreamRequest,
        response: httpx.Response,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.request = request
        self.response = response
        self.clock = clock
        self.usage: Usage | None = None
        self.first_byte_at: float | None = None
        self.finished = False
        model = request.anthropic_from_chat
        self._translator = StreamTranslator(model) if model is not None else None
        self._closing: asyncio.Future[None] | None = None

    def _rename(self, data: bytes) -> bytes:
        rename = self.request.model_rename
        return data.replace(rename[0], rename[1]) if rename is not None else data

    def _inspect(self, events: bytes) -> bytes:
        """Record usage; drop turnout's own usage chunk; keep everything else byte for byte."""
        if not any(marker in events for marker in _USAGE_MARKERS):
            return events
        kept: list[bytes] = []
        for event in events.split(b"\n\n"):
            if any(marker in event for marker in _USAGE_MARKERS):
                data = _event_json(event)
                if isinstance(data, dict):
                    self.usage = merge_usage(self.usage, parse_usage(data))
                if self.request.strip_usage_chunk and _EMPTY_CHOICES in event:
                    continue
            kept.append(event)
        return b"\n\n".join(kept)

    def _translate(self, events: bytes) -> bytes:
        """Chat chunks -> Anthropic events (the request was sent as chat for slot pinning)."""
        assert self._translator is not None
        out: list[bytes] = []
        for event in events.split(b"\n\n"):
            data = _event_json(event)
            if isinstance(data, dict):
                out += self._translator.feed(data)
        return b"".join(out)

    async def events(self) -> AsyncIterator[bytes]:
        """The SSE body, one yield per upstream read that completed at least one event."""
        buffer = b""
        try:
            async for chunk in self.response.aiter_bytes():
                if self.first_byte_at is None:
                    self.first_byte_at = self.clock()
                buffer = buffer + chunk if buffer else chunk
                end = _boundary(buffer)
                if end == 0:
                    continue
                complete, buffer = buffer[:end], buffer[end:]
                out = self._inspect(self._rename(complete))
                if self._translator is not None:
                    out = self._translate(out)
                if out:
                    yield out
        except httpx.HTTPError as exc:
            raise broke_off(self.request.backend_id, "stream", exc) from exc
        if buffer:
            yield self._rename(buffer)
        self.finished = True

    async def body(self) -> bytes:
        """A whole non-streamed body, with usage recorded and the model name rewritten."""
        try:
            content = await self.response.aread()
        except httpx.HTTPError as exc:
            raise broke_off(self.request.backend_id, "body", exc) from exc
        self.first_byte_at = self.clock()
        try:
            data = msgspec.json.decode(content)
        except msgspec.DecodeError:
            data = None
        if isinstance(data, dict):
            self.usage = parse_usage(data)
        self.finished = True
        if self.request.anthropic_from_chat is not None and isinstance(data, dict):
            return msgspec.json.encode(to_message(data, self.request.anthropic_from_chat))
        return self._rename(content)

    async def aclose(self) -> None:
        """Close the upstream response (the engine cancels the request). Shielded: when the client
        leaves, the caller is being cancelled, and httpx marks a response closed *before* it closes
        the connection, so a close cut short there would never be retried and the engine would
        generate to the end. Later calls wait for the same close."""
        if self._closing is None:
            self._closing = asyncio.ensure_future(self.response.aclose())
        await asyncio.shield(self._closing)
