"""Relaying an engine's response: SSE events through as they arrive, usage read on the way.

The hot path touches bytes only: complete events are forwarded as the engine sent them, in the
read that completed them. JSON is decoded only for the one or two events that carry ``usage`` or
``timings``. The documented rewrites are the model name (to the name the client asked for) and
the removal of a usage chunk that turnout itself asked for.

An engine that misbehaves gets a clear error, never a relayed mess (``UpstreamStreamError``, which
the relay turns into the API's error event, or a 502): a stream that is not an event stream (an HTML
error page with status 200), that ends without its API's last event (``[DONE]``, ``message_stop``,
``response.completed``) or inside an event, or that sends an event larger than ``MAX_EVENT_BYTES``;
a read that starts with a line no event stream has; a plain answer that is not JSON or is larger
than ``MAX_BODY_BYTES``. These checks cost a few byte comparisons per read.
"""

from __future__ import annotations

import asyncio
import math
import re
import time
from collections.abc import AsyncIterator, Callable, Iterator

import httpx
import msgspec
import structlog
from msgspec.structs import replace

from backends.anthropic_chat import StreamTranslator, to_message
from backends.base import UpstreamRequest
from backends.errors import UpstreamStreamError, UpstreamUnavailable
from backends.first_token import FirstToken, event_json
from backends.parsers.openai import parse_usage
from backends.transport import UpstreamResponse
from backends.watchdog import Watchdog
from policies.types import Usage

log = structlog.get_logger(__name__)
_EVENT_END = re.compile(rb"(\r\n\r\n|\n\n)")
_USAGE_MARKERS = (b'"usage"', b'"timings"')
MAX_EVENT_BYTES = 16 << 20
MAX_BODY_BYTES = 64 << 20
_LAST_EVENTS = {  # what each API's stream ends with (its path's last part)
    "completions": (b"[DONE]",),
    "messages": (b"message_stop",),
    "responses": (b"response.completed", b"response.incomplete", b"response.failed"),
}
_EMPTY_CHOICES = b'"choices":[]'
_FIELDS = (b"data:", b"event:", b":", b"id:", b"retry:")
"""What an event-stream line may start with (the events of each read are checked at their start)."""


def _boundary(buffer: bytes) -> int:
    """Index just past the last complete SSE event in ``buffer`` (0 when there is none)."""
    lf = buffer.rfind(b"\n\n")
    crlf = buffer.rfind(b"\r\n\r\n")
    return max(lf + 2 if lf >= 0 else 0, crlf + 4 if crlf >= 0 else 0)


def _split(events: bytes) -> Iterator[tuple[bytes, bytes]]:
    """Complete events with the blank line that ended each (``\n\n`` or ``\r\n\r\n``: SSE allows
    both), so that what is kept can be put back byte for byte."""
    parts = _EVENT_END.split(events)
    yield from zip(parts[0::2], [*parts[1::2], b""], strict=True)


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

    ``first_byte_at`` (monotonic) marks the first body bytes; ``first_token_at`` when the engine
    produced its first token: the read that brought a stream's first event with output in it (not its
    first bytes: ``response.created`` and ``message_start`` come before the prompt is prefilled;
    ``backends.first_token``), and for a whole body the end less the engine's own decode time
    (llama.cpp's ``timings.predicted_ms``, counted from its first token) where it
    reports one, else None: a body's first byte comes with its last token, and taken as a first token
    it would make every non-streamed request's TTFT its whole duration. ``usage`` the last
    usage/timings seen.
    """

    def __init__(
        self,
        request: UpstreamRequest,
        response: UpstreamResponse,
        clock: Callable[[], float] = time.monotonic,
        watchdog: Watchdog | None = None,
    ) -> None:
        self.request = request
        self.response = response
        self.clock = clock
        self.watchdog = watchdog or Watchdog(
            lambda: True, first_byte_s=math.inf, longest_s=math.inf, idle_s=math.inf
        )
        """Told when bytes arrive; it is armed by whoever waits on this relay (``backends.watchdog``)."""
        self.usage: Usage | None = None
        self.first_byte_at: float | None = None
        self.first_token_at: float | None = None
        self.finished = False
        api = request.url.rsplit("/", 1)[-1]
        self._last_events = _LAST_EVENTS.get(api, (b"",))
        """What this API's stream ends with (read on every relayed read: found once)."""
        self._first_token: FirstToken | None = FirstToken(api)
        """Watches the upstream events (before any translation) until one carries output."""
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
        for event, end in _split(events):
            if any(marker in event for marker in _USAGE_MARKERS):
                data = event_json(event)
                if isinstance(data, dict):
                    self.usage = merge_usage(self.usage, parse_usage(data))
                if self.request.strip_usage_chunk and _EMPTY_CHOICES in event:
                    continue
            kept += (event, end)
        return b"".join(kept)

    def _translate(self, events: bytes) -> bytes:
        """Chat chunks -> Anthropic events (the request was sent as chat for slot pinning)."""
        assert self._translator is not None
        out: list[bytes] = []
        for event, _ in _split(events):
            data = event_json(event)
            if isinstance(data, dict):
                out += self._translator.feed(data)
        return b"".join(out)

    def check_stream(self) -> None:
        """A stream request answered with something else (an HTML error page with status 200) is an
        engine that did not answer: nothing has reached the client yet, another backend may."""
        kind = self.response.headers.get("content-type", "")
        if not kind.startswith("text/event-stream"):
            raise UpstreamUnavailable(
                self.request.backend_id, f"answered a stream request with {kind or 'no content type'}"
            )

    def events(self) -> AsyncIterator[bytes]:
        """The SSE body, one yield per upstream read that completed at least one event."""
        return self._read()

    async def _read(self) -> AsyncIterator[bytes]:
        buffer = last = b""
        dog, clock, ends = self.watchdog, self.clock, self._last_events
        dog.reading = True
        try:
            async for chunk in self.response.aiter_bytes():
                dog.last = now = clock()
                if self.first_byte_at is None:
                    self.first_byte_at = now
                    dog.stream()  # from now on only silence between bytes counts
                buffer = buffer + chunk if buffer else chunk
                end = _boundary(buffer)
                if end == 0:
                    if len(buffer) > MAX_EVENT_BYTES:
                        raise self._broken(f"sent an event larger than {MAX_EVENT_BYTES:,} bytes")
                    continue
                last = complete = buffer[:end]
                buffer = buffer[end:]
                if not complete.lstrip(b"\r\n").startswith(_FIELDS):
                    raise self._broken(f"sent a line that is no event-stream field: {complete[:40]!r}")
                watch = self._first_token
                if watch is not None and watch.feed([event for event, _ in _split(complete)]):
                    self.first_token_at, self._first_token = now, None
                out = self._inspect(self._rename(complete))
                if self._translator is not None:
                    out = self._translate(out)
                if out:
                    dog.reading = False  # handing bytes on: the client's pace, not the engine's
                    yield out
                    dog.last, dog.reading = clock(), True
                    if any(marker in complete for marker in ends):
                        # the client has the whole answer: one that hangs up now, before the
                        # engine's connection ends, did not leave early (Codex CLI does)
                        self.finished = True
        except httpx.HTTPError as exc:
            raise broke_off(self.request.backend_id, "stream", exc) from exc
        finally:
            dog.reading = False
        if buffer.strip():
            raise self._broken("ended the stream inside an event")
        if not any(marker in last for marker in self._last_events):
            raise self._broken(f"ended the stream without its last event ({self._last_events[0].decode()})")
        self.finished = True

    def _broken(self, what: str) -> UpstreamStreamError:
        log.warning("upstream.malformed", backend=self.request.backend_id, error=what)
        return UpstreamStreamError(self.request.backend_id, what)

    async def body(self) -> bytes:
        """A whole non-streamed body, with usage recorded and the model name rewritten."""
        try:
            content = await self._bounded_body()
        except httpx.HTTPError as exc:
            raise broke_off(self.request.backend_id, "body", exc) from exc
        self.first_byte_at = end = self.clock()
        try:
            data = msgspec.json.decode(content)
        except msgspec.DecodeError:
            kind = self.response.headers.get("content-type") or "no content type"
            raise self._broken(
                f"answered with a body that is not JSON ({kind}, {len(content)} bytes)"
            ) from None
        if isinstance(data, dict):
            self.usage = parse_usage(data)
            decoding = self.usage.predicted_ms if self.usage is not None else None
            if decoding is not None:
                self.first_token_at = end - decoding / 1000
        self.finished = True
        if self.request.anthropic_from_chat is not None and isinstance(data, dict):
            return msgspec.json.encode(to_message(data, self.request.anthropic_from_chat))
        return self._rename(content)

    async def _bounded_body(self) -> bytes:
        parts, size = [], 0
        async for chunk in self.response.aiter_bytes():
            size += len(chunk)
            if size > MAX_BODY_BYTES:
                raise self._broken(f"answered with more than {MAX_BODY_BYTES:,} bytes")
            parts.append(chunk)
        return b"".join(parts)

    async def aclose(self) -> None:
        """Close the upstream response (the engine cancels the request). Shielded: when the client
        leaves, the caller is being cancelled, and httpx marks a response closed *before* it closes
        the connection, so a close cut short there would never be retried and the engine would
        generate to the end. Later calls wait for the same close."""
        if self._closing is None:
            self._closing = asyncio.ensure_future(self.response.aclose())
        await asyncio.shield(self._closing)
