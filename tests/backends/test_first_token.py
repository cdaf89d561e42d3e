"""When the engine produced its first token, as the relay reports it (``ResponseRelay.first_token_at``).

A stream's first token is the read that brought its first event with output in it, on every API: not
its first bytes (``response.created``, ``message_start`` and a role-only chunk come before any output;
issue #59). A whole body arrives with its last token: its first one is known only from the engine's
own timings (llama.cpp's ``timings.predicted_ms``, the decode time after the first token), and is
unknown otherwise; the end of the body is never taken for it.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from typing import Any

import httpx
import msgspec
import pytest

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


class ReadClock:
    """The time is the number of upstream reads so far: read 1 arrives at 1.0, read 2 at 2.0, ..."""

    def __init__(self) -> None:
        self.reads = 0

    def __call__(self) -> float:
        return float(self.reads)


class CountedReads(Reads):
    def __init__(self, chunks: list[bytes], clock: ReadClock) -> None:
        super().__init__(chunks)
        self.clock = clock

    async def __aiter__(self) -> AsyncIterator[bytes]:
        for chunk in self.chunks:
            self.clock.reads += 1
            yield chunk


def streamed(reads: list[bytes], url: str = CHAT, **rewrites: Any) -> ResponseRelay:
    """Relay ``reads`` (one upstream read each) and return the relay, its times in reads."""

    async def main() -> ResponseRelay:
        clock = ReadClock()
        response = httpx.Response(
            200,
            headers={"content-type": "text/event-stream"},
            stream=CountedReads(reads, clock),
            request=httpx.Request("POST", url),
        )
        upstream = UpstreamRequest("b", url, b"{}", stream=True, **rewrites)
        relayed = ResponseRelay(upstream, response, clock=clock)
        [_ async for _ in relayed.events()]
        return relayed

    return asyncio.run(main())


def sse(data: dict[str, Any], event: str | None = None) -> bytes:
    head = f"event: {event}\n".encode() if event else b""
    return head + b"data: " + msgspec.json.encode(data) + b"\n\n"


def chunk(**delta: Any) -> bytes:
    return sse({"choices": [{"index": 0, "delta": delta, "finish_reason": None}]})


DONE = b"data: [DONE]\n\n"
FINISHED = sse({"choices": [{"index": 0, "delta": {}, "finish_reason": "stop"}]})


def test_a_chat_stream_has_its_first_token_at_its_first_content_not_its_role_chunk() -> None:
    relayed = streamed([chunk(role="assistant", content=""), chunk(content="Hi"), FINISHED + DONE])
    assert (relayed.first_byte_at, relayed.first_token_at) == (1.0, 2.0)


@pytest.mark.parametrize(
    "delta",
    [
        {"reasoning_content": "hm"},
        {"reasoning": "hm"},
        {"tool_calls": [{"index": 0, "id": "c", "function": {"name": "ls", "arguments": ""}}]},
    ],
    ids=["reasoning_content", "reasoning", "tool_calls"],
)
def test_reasoning_and_tool_call_deltas_are_first_tokens(delta: dict[str, Any]) -> None:
    relayed = streamed([chunk(role="assistant"), chunk(**delta), FINISHED + DONE])
    assert relayed.first_token_at == 2.0


def test_a_text_completion_stream_has_its_first_token_at_its_first_text() -> None:
    url = "http://127.0.0.1:9/v1/completions"
    empty = sse({"choices": [{"index": 0, "text": "", "finish_reason": None}]})
    text = sse({"choices": [{"index": 0, "text": "x", "finish_reason": None}]})
    relayed = streamed([empty, text, DONE], url=url)
    assert relayed.first_token_at == 2.0


def test_an_answer_with_no_output_has_its_first_token_where_it_ended() -> None:
    """The engine's first token was its stop token: the chunk with the finish reason marks it."""
    relayed = streamed([chunk(role="assistant", content=""), FINISHED, DONE])
    assert relayed.first_token_at == 2.0


def test_a_stream_that_never_carried_output_has_no_first_token() -> None:
    relayed = streamed([chunk(role="assistant", content=""), DONE])
    assert relayed.first_token_at is None


RESPONSES = "http://127.0.0.1:9/v1/responses"


def response_event(kind: str, **fields: Any) -> bytes:
    return sse({"type": kind, **fields}, event=kind)


def test_a_responses_stream_has_its_first_token_at_its_first_delta_not_response_created() -> None:
    """vLLM sends response.created before it prefills the prompt (issue #59: a 75,890-token prompt
    was recorded at 0.05 s)."""
    reads = [
        response_event("response.created", response={"id": "r"}),
        response_event("response.in_progress", response={"id": "r"}),
        response_event("response.output_item.added", item={"type": "message"})
        + response_event("response.content_part.added", part={"type": "output_text"}),
        response_event("response.output_text.delta", delta="Hi"),
        response_event("response.completed", response={"id": "r"}),
    ]
    relayed = streamed(reads, url=RESPONSES)
    assert (relayed.first_byte_at, relayed.first_token_at) == (1.0, 4.0)


@pytest.mark.parametrize(
    "first",
    [
        response_event("response.reasoning_text.delta", delta="hm"),
        response_event("response.function_call_arguments.delta", delta="{"),
        response_event("response.output_item.added", item={"type": "function_call", "name": "ls"}),
    ],
    ids=["reasoning", "arguments", "function_call item"],
)
def test_responses_reasoning_and_tool_calls_are_first_tokens(first: bytes) -> None:
    created = response_event("response.created", response={"id": "r"})
    relayed = streamed([created, first, response_event("response.completed")], url=RESPONSES)
    assert relayed.first_token_at == 2.0


def test_responses_events_without_the_event_field_are_read_by_their_type() -> None:
    reads = [
        sse({"type": "response.created"}),
        sse({"type": "response.output_text.delta", "delta": "a"}),
        sse({"type": "response.completed"}),
    ]
    assert streamed(reads, url=RESPONSES).first_token_at == 2.0


MESSAGES = "http://127.0.0.1:9/v1/messages"


def message_event(kind: str, **fields: Any) -> bytes:
    return sse({"type": kind, **fields}, event=kind)


def test_a_messages_stream_has_its_first_token_at_its_first_delta_not_message_start() -> None:
    reads = [
        message_event("message_start", message={"id": "m"}),
        message_event("ping") + message_event("content_block_start", content_block={"type": "text"}),
        message_event("content_block_delta", delta={"type": "text_delta", "text": "Hi"}),
        message_event("message_delta", delta={"stop_reason": "end_turn"}) + message_event("message_stop"),
    ]
    relayed = streamed(reads, url=MESSAGES)
    assert (relayed.first_byte_at, relayed.first_token_at) == (1.0, 3.0)


def test_a_tool_use_block_start_is_a_first_token() -> None:
    tool = message_event("content_block_start", content_block={"type": "tool_use", "name": "ls"})
    reads = [message_event("message_start", message={}), tool, message_event("message_stop")]
    assert streamed(reads, url=MESSAGES).first_token_at == 2.0


def test_a_translated_anthropic_stream_times_the_engines_chat_chunks() -> None:
    """Anthropic from chat (llama.cpp slot pinning): the translator writes message_start for the
    role chunk; the first token is still the first chunk with content."""
    reads = [chunk(role="assistant", content=None), chunk(content="Hi"), FINISHED + DONE]
    relayed = streamed(reads, anthropic_from_chat="qwen")
    assert (relayed.first_byte_at, relayed.first_token_at) == (1.0, 2.0)
