"""ASGI middleware: a request id per request, bound into the log context and echoed as a header."""

from __future__ import annotations

import re
import uuid

import structlog
from litestar.enums import ScopeType
from litestar.types import ASGIApp, Message, Receive, Scope, Send

_VALID_ID = re.compile(r"^[A-Za-z0-9._:-]{1,128}$")


def request_id_middleware(app: ASGIApp) -> ASGIApp:
    """Accept a sane incoming ``x-request-id`` or make one; every log line of the request carries it."""

    async def middleware(scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != ScopeType.HTTP:
            await app(scope, receive, send)
            return
        incoming = next((v for k, v in scope["headers"] if k == b"x-request-id"), b"").decode("latin-1")
        request_id = incoming if _VALID_ID.match(incoming) else uuid.uuid4().hex
        header = (b"x-request-id", request_id.encode())

        async def send_with_id(message: Message) -> None:
            if message["type"] == "http.response.start":
                message["headers"] = [*message.get("headers", []), header]
            await send(message)

        with structlog.contextvars.bound_contextvars(request_id=request_id):
            await app(scope, receive, send_with_id)

    return middleware
