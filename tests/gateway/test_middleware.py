"""The gateway's ASGI middleware: request ids and the header size limit, in one layer."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest
import structlog

from gateway.errors import HeadersTooLarge
from gateway.middleware import request_context


def call(
    headers: list[tuple[bytes, bytes]], limit: int = 1024
) -> tuple[list[dict[str, Any]], dict[str, Any]]:
    """Run one HTTP request through the middleware: what was sent, and the log context the app saw."""
    sent: list[dict[str, Any]] = []
    seen: dict[str, Any] = {}

    async def app(scope: Any, receive: Any, send: Any) -> None:
        seen.update(structlog.contextvars.get_contextvars())
        await send({"type": "http.response.start", "status": 200, "headers": [(b"a", b"b")]})
        await send({"type": "http.response.body", "body": b"ok"})

    async def send(message: Any) -> None:
        sent.append(message)

    async def receive() -> Any:
        return {"type": "http.request", "body": b""}

    scope = {"type": "http", "headers": headers}
    asyncio.run(request_context(limit)(app)(scope, receive, send))
    return sent, seen


def test_a_sane_incoming_id_is_kept_logged_and_echoed() -> None:
    sent, seen = call([(b"x-request-id", b"abc-123"), (b"x-request-id", b"second")])
    assert seen["request_id"] == "abc-123"
    assert sent[0]["headers"] == [(b"a", b"b"), (b"x-request-id", b"abc-123")]
    assert "headers" not in sent[1]


def test_a_missing_or_odd_id_is_replaced() -> None:
    for headers in ([], [(b"x-request-id", b"no spaces allowed")]):
        sent, seen = call(headers)
        made = seen["request_id"]
        assert len(made) == 32
        assert set(made) <= set("0123456789abcdef")
        assert (b"x-request-id", made.encode()) in sent[0]["headers"]


def test_headers_over_the_limit_are_refused_with_the_request_id_logged() -> None:
    logged: dict[str, Any] = {}
    original = HeadersTooLarge.__init__

    def remember(self: HeadersTooLarge, *args: Any) -> None:
        logged.update(structlog.contextvars.get_contextvars())  # what the error's log line carries
        original(self, *args)

    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(HeadersTooLarge, "__init__", remember)
        with pytest.raises(HeadersTooLarge, match="exceed the limit of 64"):
            call([(b"x-request-id", b"big-one"), (b"cookie", b"x" * 100)], limit=64)
    assert logged["request_id"] == "big-one"
    sent, _ = call([(b"cookie", b"x" * 50)], limit=64)  # 56 bytes: within
    assert sent[0]["status"] == 200
