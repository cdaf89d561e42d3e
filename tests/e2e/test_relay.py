"""Relaying through the gateway: what the client gets is what the engine sent, but the documented rewrites.

Documented rewrites: the ``model`` field says the name the client asked for; a usage chunk that
turnout itself requested from vLLM (``stream_options.include_usage``) is removed again.
"""

from __future__ import annotations

import json
from typing import Any

import openai
import pytest

from tests.e2e.conftest import Stack

CHAT = [{"role": "user", "content": "Write a haiku about routers."}]
TOOLS = [
    {
        "type": "function",
        "function": {
            "name": "read_file",
            "description": "Read a file",
            "parameters": {
                "type": "object",
                "properties": {"path": {"type": "string"}, "max_lines": {"type": "integer"}},
                "required": ["path"],
            },
        },
    }
]


def events_of(raw: bytes) -> list[bytes]:
    return [e for e in raw.split(b"\n\n") if e]


def expected_client_bytes(sent: bytes, upstream: str, client: str, strip_usage: bool) -> list[bytes]:
    renamed = sent.replace(f'"model":"{upstream}"'.encode(), f'"model":"{client}"'.encode())
    return [e for e in events_of(renamed) if not (strip_usage and b'"choices":[]' in e)]


@pytest.mark.parametrize(
    ("model", "backend", "upstream"), [("m-vllm", "vllm", "up-vllm"), ("m-llama", "llama", "up-llama")]
)
@pytest.mark.parametrize("include_usage", [False, True])
@pytest.mark.parametrize("tools", [False, True])
def test_stream_bytes_match_engine(
    stack: Stack, model: str, backend: str, upstream: str, include_usage: bool, tools: bool
) -> None:
    """Event by event, the client receives the engine's bytes (text, tool-call deltas, usage)."""
    body: dict[str, Any] = {"model": model, "messages": CHAT, "stream": True, "max_tokens": 24}
    if include_usage:
        body["stream_options"] = {"include_usage": True}
    if tools:
        body["tools"] = TOOLS
    with stack.client() as client, client.stream("POST", "/v1/chat/completions", json=body) as response:
        assert response.status_code == 200
        assert response.headers["content-type"].startswith("text/event-stream")
        assert response.headers["x-turnout-backend"] == backend
        received = b"".join(response.iter_raw())
    path, sent = stack.taps[backend].bodies[-1]
    assert path == "/v1/chat/completions"
    strip = backend == "vllm" and not include_usage
    assert events_of(received) == expected_client_bytes(sent, upstream, model, strip)
    assert events_of(received)[-1] == b"data: [DONE]"
    if tools:
        assert b'"tool_calls"' in received
    if backend == "vllm":  # the usage chunk turnout asked for never reaches a client that did not
        assert (b'"usage"' in received) == include_usage


@pytest.mark.parametrize(("model", "backend"), [("m-vllm", "vllm"), ("m-llama", "llama")])
def test_upstream_body_is_the_clients_but_the_adapter_rewrites(
    stack: Stack, model: str, backend: str
) -> None:
    body = {
        "model": model,
        "messages": CHAT,
        "stream": True,
        "max_tokens": 4,
        "temperature": 0.3,
        "x_custom": [1],
    }
    with stack.client() as client, client.stream("POST", "/v1/chat/completions", json=body) as response:
        response.read()
    sent = json.loads(stack.taps[backend].requests[-1])
    expected = {**body, "model": "up-" + backend}
    if backend == "vllm":
        expected["stream_options"] = {"include_usage": True}
    else:  # llama.cpp: prompt caching on, and the session pinned to its slot
        expected["cache_prompt"] = True
        expected["id_slot"] = int(response.headers["x-turnout-slot"])
    assert sent == expected


@pytest.mark.parametrize(("model", "backend"), [("m-vllm", "vllm"), ("m-llama", "llama")])
def test_non_stream_body_matches_engine(stack: Stack, model: str, backend: str) -> None:
    body = {"model": model, "messages": CHAT, "max_tokens": 8}
    with stack.client() as client:
        response = client.post("/v1/chat/completions", json=body)
    assert response.status_code == 200
    _, sent = stack.taps[backend].bodies[-1]
    assert response.content == sent.replace(f'"model":"up-{backend}"'.encode(), f'"model":"{model}"'.encode())
    assert response.json()["model"] == model
    assert response.headers["x-turnout-route-reason"].startswith("only-candidate")
    assert len(response.headers["x-request-id"]) >= 16


def test_request_id_is_taken_from_the_client(stack: Stack) -> None:
    with stack.client() as client:
        response = client.post(
            "/v1/chat/completions",
            json={"model": "m-vllm", "messages": CHAT, "max_tokens": 2},
            headers={"x-request-id": "abc-123"},
        )
    assert response.headers["x-request-id"] == "abc-123"


class TestOpenAISDK:
    """The official SDK, stream and non-stream, chat and completions, to each engine."""

    @pytest.fixture
    def sdk(self, stack: Stack) -> openai.OpenAI:
        return openai.OpenAI(base_url=stack.url + "/v1", api_key="unused", max_retries=0)

    @pytest.mark.parametrize("model", ["m-vllm", "m-llama"])
    def test_chat(self, sdk: openai.OpenAI, model: str) -> None:
        result = sdk.chat.completions.create(model=model, messages=CHAT, max_tokens=12)  # type: ignore[arg-type]
        assert result.model == model
        assert result.choices[0].message.content
        assert result.usage is not None
        assert result.usage.completion_tokens == 12
        assert result.choices[0].finish_reason == "length"

    @pytest.mark.parametrize("model", ["m-vllm", "m-llama"])
    def test_chat_stream_with_usage(self, sdk: openai.OpenAI, model: str) -> None:
        stream = sdk.chat.completions.create(
            model=model,
            messages=CHAT,  # type: ignore[arg-type]
            max_tokens=10,
            stream=True,
            stream_options={"include_usage": True},
        )
        chunks = list(stream)
        text = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
        assert text
        usage = chunks[-1].usage
        assert usage is not None
        assert usage.completion_tokens == 10

    @pytest.mark.parametrize("model", ["m-vllm", "m-llama"])
    def test_tool_call_stream(self, sdk: openai.OpenAI, model: str) -> None:
        stream = sdk.chat.completions.create(
            model=model,
            messages=CHAT,  # type: ignore[arg-type]
            tools=TOOLS,  # type: ignore[arg-type]
            stream=True,
        )
        arguments = ""
        names = []
        finish = None
        for chunk in stream:
            for choice in chunk.choices:
                for call in choice.delta.tool_calls or []:
                    if call.function and call.function.name:
                        names.append(call.function.name)
                    if call.function and call.function.arguments:
                        arguments += call.function.arguments
                finish = choice.finish_reason or finish
        assert names == ["read_file"]
        assert "path" in json.loads(arguments)
        assert finish == "tool_calls"

    @pytest.mark.parametrize("model", ["m-vllm", "m-llama"])
    def test_completions(self, sdk: openai.OpenAI, model: str) -> None:
        result = sdk.completions.create(model=model, prompt="Once upon a time", max_tokens=6)
        assert result.choices[0].text
        stream = sdk.completions.create(model=model, prompt="Once upon a time", max_tokens=6, stream=True)
        assert "".join(c.choices[0].text for c in stream if c.choices)

    def test_models(self, sdk: openai.OpenAI) -> None:
        models = {m.id: m for m in sdk.models.list()}
        assert set(models) == {"m-vllm", "m-llama", "m-both"}
        both = models["m-both"].model_dump()
        assert [b["id"] for b in both["backends"]] == ["vllm", "llama"]
        assert both["context_window"] == 32768
        assert both["aliases"] == ["both"]


@pytest.mark.parametrize(("model", "backend"), [("m-vllm", "vllm"), ("m-llama", "llama")])
def test_a_client_accepting_zstd_gets_the_stream_as_the_engine_sent_it(
    stack: Stack, model: str, backend: str
) -> None:
    """Codex sends ``Accept-Encoding: zstd,gzip`` on every request: the stream stays plain SSE,
    event by event, with no ``Content-Encoding``."""
    body = {"model": model, "input": "Write a haiku about routers.", "stream": True, "max_output_tokens": 24}
    headers = {"accept-encoding": "zstd,gzip"}
    with (
        stack.client() as client,
        client.stream("POST", "/v1/responses", json=body, headers=headers) as response,
    ):
        assert response.status_code == 200
        assert "content-encoding" not in response.headers
        received = b"".join(response.iter_raw())
    events = events_of(received)
    assert events[0].startswith(b"event: response.created")
    assert events[-1].startswith(b"event: response.completed")
    path, sent = stack.taps[backend].bodies[-1]
    assert path == "/v1/responses"
    assert len(events) == len(events_of(sent))
