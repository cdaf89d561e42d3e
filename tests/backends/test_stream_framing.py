"""SSE framing: however the engine's bytes are cut into reads, the relay forwards the same events
and reads the same usage as when they arrive in one piece."""

from __future__ import annotations

import asyncio
import contextlib
import itertools
from collections.abc import AsyncIterator
from typing import Any

import httpx
import msgspec
from hypothesis import example, given
from hypothesis import strategies as st

from backends.base import UpstreamRequest, model_rename
from backends.stream import ResponseRelay
from policies import Usage

CHAT = "http://127.0.0.1:9/v1/chat/completions"
MESSAGES = "http://127.0.0.1:9/v1/messages"


class Reads(httpx.AsyncByteStream):
    """An upstream body delivered in the given reads."""

    def __init__(self, chunks: list[bytes]) -> None:
        self.chunks = chunks

    async def __aiter__(self) -> AsyncIterator[bytes]:
        for chunk in self.chunks:
            yield chunk


def relay(chunks: list[bytes], url: str = CHAT, **rewrites: Any) -> tuple[bytes, Usage | None]:
    """What the client receives, and the usage the relay read."""

    async def main() -> tuple[bytes, Usage | None]:
        headers = {"content-type": "text/event-stream"}
        response = httpx.Response(
            200, headers=headers, stream=Reads(chunks), request=httpx.Request("POST", url)
        )
        relayed = ResponseRelay(UpstreamRequest("vllm", url, b"{}", stream=True, **rewrites), response)
        out = [events async for events in relayed.events()]
        return b"".join(out), relayed.usage

    return asyncio.run(main())


def split(stream: bytes, cuts: list[int]) -> list[bytes]:
    points = sorted({0, len(stream), *(c % (len(stream) + 1) for c in cuts)})
    return [stream[a:b] for a, b in itertools.pairwise(points)]


text = st.text(st.characters(codec="utf-8", exclude_categories=("Cs",)), max_size=12)
counts = st.integers(0, 100_000)


@st.composite
def openai_stream(draw: st.DrawFn) -> list[dict[str, Any]]:
    """Chat chunks as vLLM or llama-server send them: deltas, a finish, maybe usage and timings."""
    base = {"id": "chatcmpl-1", "object": "chat.completion.chunk", "created": 1, "model": "up"}
    chunks = [
        {**base, "choices": [{"index": 0, "delta": {"content": piece}, "finish_reason": None}]}
        for piece in draw(st.lists(text, max_size=6))
    ]
    chunks.append({**base, "choices": [{"index": 0, "delta": {}, "finish_reason": "stop"}]})
    prompt, completion = draw(counts), draw(counts)
    if draw(st.booleans()):  # vLLM's usage chunk (include_usage)
        usage = {
            "prompt_tokens": prompt,
            "completion_tokens": completion,
            "total_tokens": prompt + completion,
        }
        chunks.append({**base, "choices": [], "usage": usage})
    if draw(st.booleans()):  # llama-server's timings on the last chunk
        chunks[-1] = {
            **chunks[-1],
            "timings": {"prompt_n": prompt, "cache_n": draw(counts), "predicted_n": completion},
        }
    return chunks


@st.composite
def anthropic_stream(draw: st.DrawFn) -> list[tuple[str, dict[str, Any]]]:
    """Messages events: input usage in ``message_start``, output usage in ``message_delta``."""
    usage = {"input_tokens": draw(counts), "output_tokens": 0}
    message = {
        "id": "m",
        "type": "message",
        "role": "assistant",
        "content": [],
        "model": "up",
        "usage": usage,
    }
    start = {"type": "message_start", "message": message}
    deltas = [
        {"type": "content_block_delta", "index": 0, "delta": {"type": "text_delta", "text": piece}}
        for piece in draw(st.lists(text, max_size=5))
    ]
    end = {
        "type": "message_delta",
        "delta": {"stop_reason": "end_turn"},
        "usage": {"output_tokens": draw(counts)},
    }
    return [(e["type"], e) for e in (start, *deltas, end, {"type": "message_stop"})]


def sse(events: list[Any], end: bytes) -> bytes:
    """The events framed with ``end`` (chat chunks are followed by ``[DONE]``, as they end)."""
    out = []
    for event in events:
        name, data = event if isinstance(event, tuple) else (None, event)
        head = b"event: " + name.encode() + end[: len(end) // 2] if name else b""
        out.append(head + b"data: " + msgspec.json.encode(data) + end)
    chat = bool(events) and not isinstance(events[0], tuple)
    return b"".join(out) + (b"data: [DONE]" + end if chat else b"")


cuts = st.lists(st.integers(0, 10_000), max_size=12)


@given(openai_stream(), cuts)
def test_openai_events_and_usage_do_not_depend_on_the_reads(
    events: list[dict[str, Any]], at: list[int]
) -> None:
    stream = sse(events, b"\n\n")
    whole = relay([stream])
    assert whole[0] == stream  # nothing to rewrite: byte for byte
    assert relay(split(stream, at)) == whole


@given(anthropic_stream(), cuts)
def test_anthropic_usage_merges_the_same_way_however_it_is_cut(
    events: list[tuple[str, dict[str, Any]]], at: list[int]
) -> None:
    stream = sse(events, b"\n\n")
    forwarded, usage = relay(split(stream, at), MESSAGES)
    assert forwarded == stream
    start, end = events[0][1]["message"]["usage"], events[-2][1]["usage"]
    assert usage == Usage(start["input_tokens"], end["output_tokens"])


@given(openai_stream(), cuts)
def test_rewrites_do_not_depend_on_the_reads(events: list[dict[str, Any]], at: list[int]) -> None:
    """The model name rewritten and turnout's own usage chunk removed, whatever the cuts."""
    stream = sse(events, b"\n\n")
    rewrites = {"strip_usage_chunk": True, "model_rename": model_rename("up", "client-name")}
    whole = relay([stream], **rewrites)
    assert b'"model":"up"' not in whole[0]
    assert b'"choices":[]' not in whole[0]
    assert relay(split(stream, at), **rewrites) == whole


@given(openai_stream(), cuts)
@example(  # vLLM's usage chunk and [DONE] in one read: no usage (with strip_usage_chunk, no [DONE] either)
    events=[{"choices": [], "usage": {"prompt_tokens": 5, "completion_tokens": 2, "total_tokens": 7}}], at=[]
)
def test_crlf_framing_gives_the_same_usage(events: list[dict[str, Any]], at: list[int]) -> None:
    """SSE allows CRLF line ends (sse-starlette's default); an OpenAI-compatible server may use them."""
    stream = sse(events, b"\r\n\r\n")
    one_read_per_event = [e + b"\r\n\r\n" for e in stream.split(b"\r\n\r\n") if e]
    assert relay(split(stream, at)) == relay(one_read_per_event)


def test_a_client_that_leaves_after_the_last_event_got_the_whole_answer() -> None:
    """Codex CLI closes its connection as soon as ``response.completed`` arrives, while the engine's
    connection is still open: the answer was whole, so the request finished (it is not a 499 and its
    usage is learned); a client that leaves before the last event did not."""
    url = "http://127.0.0.1:9/v1/responses"
    usage = {"input_tokens": 5, "output_tokens": 2}
    done = {"type": "response.completed", "response": {"usage": usage}}
    reads = [
        b'event: response.created\ndata: {"type":"response.created"}\n\n',
        b"event: response.completed\ndata: " + msgspec.json.encode(done) + b"\n\n",
    ]

    class StaysOpen(Reads):
        """The engine's reads, then a connection that has not closed yet."""

        async def __aiter__(self) -> AsyncIterator[bytes]:
            for chunk in self.chunks:
                yield chunk
            await asyncio.Event().wait()

    async def leave_after(n: int) -> ResponseRelay:
        headers = {"content-type": "text/event-stream"}
        request = httpx.Request("POST", url)
        response = httpx.Response(200, headers=headers, stream=StaysOpen(reads), request=request)
        relayed = ResponseRelay(UpstreamRequest("vllm", url, b"{}", stream=True), response)
        events = relayed.events()
        for _ in range(n):
            await anext(events)
        # the server asks for the next events (the engine's connection is still open) and the client
        # hangs up meanwhile: the wait is cancelled
        waiting = asyncio.ensure_future(anext(events))
        await asyncio.sleep(0.01)
        waiting.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await waiting
        return relayed

    assert not asyncio.run(leave_after(1)).finished
    finished = asyncio.run(leave_after(2))
    assert finished.finished
    assert finished.usage == Usage(5, 2, None)
