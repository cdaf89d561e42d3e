"""The gateway's one ASGI middleware: a request id per request, bound into the log context and echoed
as a header, and a limit on the size of request headers.

One layer, not one per concern: every ASGI layer keeps a coroutine alive for as long as its request
runs (a stream's whole life) and wraps every ``send``, so each costs CPU per event and memory per
open stream (docs/benchmarks.md, "Where the CPU goes").
"""

from __future__ import annotations

import re
import secrets
from collections.abc import Callable

import structlog
from litestar.enums import ScopeType
from litestar.types import ASGIApp, Message, Receive, Scope, Send

from gateway.errors import HeadersTooLarge

_VALID_ID = re.compile(r"^[A-Za-z0-9._:-]{1,128}$")


def request_context(max_header_bytes: int) -> Callable[[ASGIApp], ASGIApp]:
    """Accept a sane incoming ``x-request-id`` or make one (every log line of the request carries
    it), and refuse requests whose headers pass ``max_header_bytes`` in all (431, in the API's error
    shape: uvicorn's httptools parser takes headers of any size; the bytes were read, but go no
    further)."""

    def wrap(app: ASGIApp) -> ASGIApp:
        async def middleware(scope: Scope, receive: Receive, send: Send) -> None:
            if scope["type"] != ScopeType.HTTP:
                await app(scope, receive, send)
                return
            incoming, size = b"", 0
            for name, value in scope["headers"]:
                size += len(name) + len(value)
                if name == b"x-request-id" and not incoming:
                    incoming = value
            given = incoming.decode("latin-1")
            request_id = given if _VALID_ID.match(given) else secrets.token_hex(16)  # uuid4().hex, cheaper
            header = (b"x-request-id", request_id.encode())

            async def send_with_id(message: Message) -> None:
                if message["type"] == "http.response.start":
                    message["headers"] = [*message.get("headers", []), header]
                await send(message)

            with structlog.contextvars.bound_contextvars(request_id=request_id):
                if size > max_header_bytes:
                    raise HeadersTooLarge(
                        f"Request headers of {size} bytes exceed the limit of {max_header_bytes}."
                    )
                await app(scope, receive, send_with_id)

        return middleware

    return wrap
