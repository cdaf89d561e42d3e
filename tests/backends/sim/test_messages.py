"""``/v1/messages`` and ``/v1/messages/count_tokens`` on both simulators (``anthropic`` SDK and raw)."""

from __future__ import annotations

import json
from typing import Any

import anthropic
import pytest

from tests.backends.sim.simhelp import running, wait_until

MESSAGES = [{"role": "user", "content": "Say something about routers."}]
WEATHER = {
    "name": "get_weather",
    "description": "Weather for a city",
    "input_schema": {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]},
}


def events(raw: str) -> list[tuple[str, dict[str, Any]]]:
    """``(event, data)`` pairs of a named-event SSE body."""
    out = []
    for block in raw.split("\n\n"):
        lines = dict(line.split(": ", 1) for line in block.splitlines() if ": " in line)
        if "event" in lines:
            out.append((lines["event"], json.loads(lines["data"])))
    return out


@pytest.mark.parametrize("kind", ["llamacpp", "vllm"])
def test_sdk_text_and_stream(kind: str) -> None:
    with running(kind) as (client, _):
        sdk = anthropic.Anthropic(base_url=str(client.base_url), api_key="x", max_retries=0)
        message = sdk.messages.create(model="sim-model", max_tokens=5, messages=MESSAGES)  # type: ignore[arg-type]
        assert message.stop_reason == "max_tokens"
        assert message.usage.output_tokens == 5
        assert message.content[0].type == "text"
        assert message.content[0].text
        with sdk.messages.stream(model="sim-model", max_tokens=64, messages=MESSAGES) as stream:  # type: ignore[arg-type]
            text = "".join(stream.text_stream)
            final = stream.get_final_message()
        assert final.stop_reason == "end_turn"
        assert text == final.content[0].text  # type: ignore[union-attr]


@pytest.mark.parametrize("kind", ["llamacpp", "vllm"])
def test_tool_use_blocks(kind: str) -> None:
    with running(kind) as (client, _):
        body = {"model": "sim-model", "max_tokens": 200, "messages": MESSAGES, "tools": [WEATHER]}
        message = client.post("/v1/messages", json=body).json()
        assert message["stop_reason"] == "tool_use"
        block = message["content"][-1]
        assert block["type"] == "tool_use"
        assert block["name"] == "get_weather"
        assert "city" in block["input"]
        raw = client.post("/v1/messages", json=body | {"stream": True}).text
        seq = events(raw)
        starts = [d for e, d in seq if e == "content_block_start"]
        assert starts[0]["content_block"]["type"] == "tool_use"
        partial = "".join(d["delta"]["partial_json"] for e, d in seq if e == "content_block_delta")
        assert json.loads(partial) == block["input"]
        assert [e for e, _ in seq][-3:] == ["content_block_stop", "message_delta", "message_stop"]
        assert "[DONE]" not in raw
        # the tool result turn answers in text
        history = [
            *MESSAGES,
            {"role": "assistant", "content": [block]},
            {
                "role": "user",
                "content": [{"type": "tool_result", "tool_use_id": block["id"], "content": "sunny"}],
            },
        ]
        answer = client.post("/v1/messages", json=body | {"messages": history}).json()
        assert answer["stop_reason"] == "end_turn"
        assert answer["content"][0]["type"] == "text"


def test_llama_usage_counts_cache_and_ignores_id_slot() -> None:
    """llama.cpp drops ``id_slot``/``cache_prompt`` when converting a Messages body."""
    with running("llamacpp", slots=2) as (client, engine):
        body = {"max_tokens": 2, "messages": MESSAGES, "system": [{"type": "text", "text": "Be brief."}]}
        first = client.post("/v1/messages", json=body | {"id_slot": 0}).json()
        second = client.post("/v1/messages", json=body | {"id_slot": 1, "cache_prompt": False}).json()
        assert first["usage"]["cache_read_input_tokens"] == 0
        total = first["usage"]["input_tokens"]
        assert second["usage"]["cache_read_input_tokens"] > 0
        assert second["usage"]["cache_read_input_tokens"] + second["usage"]["input_tokens"] == total
        slots = {e.slot for e in engine.events if e.kind.value == "start"}
        assert len(slots) == 1  # id_slot ignored: prefix similarity picked the same slot twice


def test_count_tokens_matches_prompt() -> None:
    for kind in ("llamacpp", "vllm"):
        with running(kind) as (client, _):
            body = {"model": "sim-model", "messages": MESSAGES, "tools": [WEATHER]}
            count = client.post("/v1/messages/count_tokens", json=body).json()
            used = client.post("/v1/messages", json=body | {"max_tokens": 1}).json()["usage"]
            assert count["input_tokens"] == sum(v for k, v in used.items() if k != "output_tokens")
            if kind == "vllm":
                assert count["context_management"] == {"original_input_tokens": count["input_tokens"]}


def test_errors() -> None:
    with running("llamacpp") as (client, _):
        missing = client.post("/v1/messages", json={"max_tokens": 2})
        assert missing.status_code == 500
        assert missing.json()["error"]["type"] == "server_error"
        too_long = client.post(
            "/v1/messages",
            json={"messages": [{"role": "user", "content": "route " * 40000}], "max_tokens": 2},
        )
        assert too_long.status_code == 400
        assert too_long.json()["error"]["type"] == "exceed_context_size_error"
    with running("vllm") as (client, _):
        wrong = client.post("/v1/messages", json={"model": "nope", "max_tokens": 2, "messages": MESSAGES})
        assert wrong.status_code == 404
        assert wrong.json() == {
            "type": "error",
            "error": {"type": "NotFoundError", "message": wrong.json()["error"]["message"]},
        }
        assert (
            client.post("/v1/messages", json={"model": "sim-model", "messages": MESSAGES}).status_code == 400
        )
        sdk = anthropic.Anthropic(base_url=str(client.base_url), api_key="x", max_retries=0)
        with pytest.raises(anthropic.NotFoundError):
            sdk.messages.create(model="nope", max_tokens=2, messages=MESSAGES)  # type: ignore[arg-type]


def test_stream_disconnect_cancels() -> None:
    """Leaving a /v1/messages stream mid-answer cancels the request.

    The answer is its natural 16 to 48 tokens (``/v1/messages`` drops ``ignore_eos``), so the decode
    is slow instead: one token every 2 s leaves the test 30 s or more to leave before the answer ends,
    and costs nothing, since it leaves after the first token.
    """
    with running("llamacpp", time_scale=1.0, decode_tok_s=0.5) as (client, engine):
        body = {"max_tokens": 400, "messages": MESSAGES, "stream": True}
        with client.stream("POST", "/v1/messages", json=body | {"metadata": {"user_id": "u"}}) as response:
            for line in response.iter_lines():
                if "content_block_delta" in line:
                    break
        assert wait_until(lambda: any(e.kind.value == "cancel" for e in engine.events))
        assert not [e for e in engine.events if e.kind.value == "finish"]
