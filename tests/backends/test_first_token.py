"""When the engine produced its first token, as the relay reports it (``ResponseRelay.first_token_at``).

A stream's first token is its first bytes. A whole body arrives with its last token: its first one is
known only from the engine's own timings (llama.cpp's ``timings.predicted_ms``, the decode time after
the first token), and is unknown otherwise; the end of the body is never taken for it.
"""

from __future__ import annotations

import asyncio
from typing import Any

import httpx
import msgspec

from backends.base import UpstreamRequest
from backends.stream import ResponseRelay
from tests.backends.test_stream_framing import Reads

CHAT = "http://127.0.0.1:9/v1/chat/completions"


class Ticking:
    """A clock that advances one second each time it is read."""

    def __init__(self, start: float = 100.0) -> None:
        self.now = start

    def __call__(self) -> float:
        self.now += 1.0
        return self.now


def whole_body(answer: dict[str, Any]) -> ResponseRelay:
    async def main() -> ResponseRelay:
        response = httpx.Response(
            200,
            headers={"content-type": "application/json"},
            stream=Reads([msgspec.json.encode(answer)]),
            request=httpx.Request("POST", CHAT),
        )
        relayed = ResponseRelay(UpstreamRequest("b", CHAT, b"{}", stream=False), response, clock=Ticking())
        await relayed.body()
        return relayed

    return asyncio.run(main())


USAGE = {"prompt_tokens": 40, "completion_tokens": 9}


def test_a_whole_body_with_engine_timings_has_its_first_token_before_its_end() -> None:
    relayed = whole_body(
        {"choices": [], "usage": USAGE, "timings": {"prompt_ms": 120.0, "predicted_ms": 750.0}}
    )
    assert relayed.first_byte_at == 101.0
    assert relayed.first_token_at == 101.0 - 0.75


def test_a_whole_body_without_timings_has_no_first_token() -> None:
    """vLLM reports no timings: the end of its body is not a first token."""
    relayed = whole_body({"choices": [], "usage": USAGE})
    assert relayed.first_byte_at == 101.0
    assert relayed.first_token_at is None


def test_a_stream_has_its_first_token_at_its_first_bytes() -> None:
    async def main() -> ResponseRelay:
        events = [b'data: {"choices":[{"delta":{"content":"a"}}]}\n\n', b"data: [DONE]\n\n"]
        response = httpx.Response(
            200,
            headers={"content-type": "text/event-stream"},
            stream=Reads(events),
            request=httpx.Request("POST", CHAT),
        )
        relayed = ResponseRelay(UpstreamRequest("b", CHAT, b"{}", stream=True), response, clock=Ticking())
        [_ async for _ in relayed.events()]
        return relayed

    relayed = asyncio.run(main())
    assert relayed.first_token_at == relayed.first_byte_at == 101.0
