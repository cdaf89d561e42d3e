"""ASGI middleware: a request id per request, bound into the log context and echoed as a header; a
limit on the size of request headers."""

from __future__ import annotations

import re
import secrets
from collections.abc import Callable

import structlog
from litestar.enums import ScopeType
from litestar.types import ASGIApp, Message, Receive, Scope, Send

from gateway.errors import HeadersTooLarge

_VALID_ID = re.compile(r"^[A-Za-z0-9._:-]{1,128}$")


def request_id_middleware(app: ASGIApp) -> ASGIApp:
    """Accept a sane incoming ``x-request-id`` or make one; every log line of the request carries it."""

    async def middleware(scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != ScopeType.HTTP:
            await app(scope, receive, send)
            return
        incoming = next((v for k, v in scope["headers"] if k == b"x-request-id"), b"").decode("latin-1")
        request_id = incoming if _VALID_ID.match(incoming) else secrets.token_hex(16)  # uuid4().hex, cheaper
        header = (b"x-request-id", request_id.encode())

        async def send_with_id(message: Message) -> None:
            if message["type"] == "http.response.start":
                message["headers"] = [*message.get("headers", []), header]
            await send(message)

        with structlog.contextvars.bound_contextvars(request_id=request_id):
            await app(scope, receive, send_with_id)

    return middleware


def header_limit(max_bytes: int) -> Callable[[ASGIApp], ASGIApp]:
    """Refuse requests whose headers pass ``max_bytes`` in all (431, in the API's error shape).
    uvicorn's httptools parser takes headers of any size: the bytes were read, but go no further."""

    def wrap(app: ASGIApp) -> ASGIApp:
        async def middleware(scope: Scope, receive: Receive, send: Send) -> None:
            if scope["type"] == ScopeType.HTTP:
                size = sum(len(name) + len(value) for name, value in scope["headers"])
                if size > max_bytes:
                    raise HeadersTooLarge(f"Request headers of {size} bytes exceed the limit of {max_bytes}.")
            await app(scope, receive, send)

        return middleware

    return wrap
