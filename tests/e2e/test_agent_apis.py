"""The agents' APIs through turnout to both simulators, with the official SDKs.

Anthropic Messages (Claude-Code-style clients) and OpenAI Responses (Codex-style clients): text,
streams, a tool round trip, token counting; byte-faithful relay except the model-name rewrite.
"""

from __future__ import annotations

import json
from typing import Any

import anthropic
import openai
import pytest

from tests.e2e.conftest import Stack

MODELS = ["m-vllm", "m-llama"]
ASK = [{"role": "user", "content": "What is the weather in Lisbon?"}]
WEATHER = {
    "name": "get_weather",
    "description": "Weather for a city",
    "input_schema": {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]},
}
WEATHER_FN = {"type": "function", "name": "get_weather", "description": "Weather for a city",
              "parameters": WEATHER["input_schema"]}  # fmt: skip


@pytest.fixture
def claude(stack: Stack) -> anthropic.Anthropic:
    return anthropic.Anthropic(base_url=stack.url, api_key="unused", max_retries=0)


@pytest.fixture
def codex(stack: Stack) -> openai.OpenAI:
    return openai.OpenAI(base_url=stack.url + "/v1", api_key="unused", max_retries=0)


@pytest.mark.parametrize("model", MODELS)
def test_messages_text_and_stream(claude: anthropic.Anthropic, model: str) -> None:
    message = claude.messages.create(model=model, max_tokens=6, messages=ASK)  # type: ignore[arg-type]
    assert message.model == model
    assert message.usage.output_tokens == 6
    assert message.stop_reason == "max_tokens"
    with claude.messages.stream(model=model, max_tokens=64, messages=ASK) as stream:  # type: ignore[arg-type]
        text = "".join(stream.text_stream)
        final = stream.get_final_message()
    assert text
    assert final.model == model
    assert final.usage.output_tokens > 0


@pytest.mark.parametrize("model", MODELS)
def test_messages_tool_use_round_trip(claude: anthropic.Anthropic, model: str) -> None:
    first = claude.messages.create(model=model, max_tokens=200, messages=ASK, tools=[WEATHER])  # type: ignore[arg-type,list-item]
    assert first.stop_reason == "tool_use"
    call = next(block for block in first.content if block.type == "tool_use")
    assert "city" in call.input  # type: ignore[operator]
    follow_up = [
        *ASK,
        {"role": "assistant", "content": [block.model_dump() for block in first.content]},
        {
            "role": "user",
            "content": [{"type": "tool_result", "tool_use_id": call.id, "content": "Sunny, 24 C"}],
        },
    ]
    second = claude.messages.create(model=model, max_tokens=200, messages=follow_up, tools=[WEATHER])  # type: ignore[arg-type,list-item]
    assert second.stop_reason in ("end_turn", "max_tokens")
    assert second.content[0].type == "text"


@pytest.mark.parametrize("model", MODELS)
def test_messages_streamed_tool_input_arrives_whole(claude: anthropic.Anthropic, model: str) -> None:
    with claude.messages.stream(model=model, max_tokens=200, messages=ASK, tools=[WEATHER]) as stream:  # type: ignore[arg-type,list-item]
        partials = [e.partial_json for e in stream if e.type == "input_json"]
        final = stream.get_final_message()
    call = next(block for block in final.content if block.type == "tool_use")
    assert len(partials) > 1  # streamed in pieces, not merged into one
    assert json.loads("".join(partials)) == call.input


@pytest.mark.parametrize("model", MODELS)
def test_count_tokens_matches_the_engines_usage(claude: anthropic.Anthropic, model: str) -> None:
    counted = claude.messages.count_tokens(model=model, messages=ASK)  # type: ignore[arg-type]
    used = claude.messages.create(model=model, max_tokens=1, messages=ASK)  # type: ignore[arg-type]
    total = used.usage.input_tokens + (used.usage.cache_read_input_tokens or 0)
    assert counted.input_tokens == total


@pytest.mark.parametrize("model", MODELS)
def test_responses_text_and_stream(codex: openai.OpenAI, model: str) -> None:
    response = codex.responses.create(model=model, input="Say something about routers.", max_output_tokens=16)
    assert response.model == model
    assert response.output_text
    assert response.usage is not None
    events = list(codex.responses.create(model=model, input="Say something about routers.", stream=True))
    types = [event.type for event in events]
    assert types[0] == "response.created"
    assert types[-1] == "response.completed"
    deltas = "".join(e.delta for e in events if e.type == "response.output_text.delta")  # type: ignore[union-attr]
    assert deltas


@pytest.mark.parametrize("model", MODELS)
def test_responses_function_call_round_trip(codex: openai.OpenAI, model: str) -> None:
    first = codex.responses.create(model=model, input=ASK, tools=[WEATHER_FN])  # type: ignore[arg-type,list-item]
    call = next(item for item in first.output if item.type == "function_call")
    assert "city" in json.loads(call.arguments)  # type: ignore[union-attr]
    follow: list[Any] = [
        *ASK,
        call.model_dump(),
        {"type": "function_call_output", "call_id": call.call_id, "output": "Sunny"},
    ]  # type: ignore[union-attr]
    second = codex.responses.create(model=model, input=follow, tools=[WEATHER_FN])  # type: ignore[arg-type,list-item]
    assert second.output_text


@pytest.mark.parametrize("model", MODELS)
def test_responses_streamed_arguments_arrive_whole(codex: openai.OpenAI, model: str) -> None:
    events = list(codex.responses.create(model=model, input=ASK, tools=[WEATHER_FN], stream=True))  # type: ignore[arg-type,list-item]
    deltas = [e.delta for e in events if e.type == "response.function_call_arguments.delta"]  # type: ignore[union-attr]
    done = next(e for e in events if e.type == "response.output_item.done" and e.item.type == "function_call")  # type: ignore[union-attr]
    assert len(deltas) > 1  # streamed in pieces, not merged into one
    assert "".join(deltas) == done.item.arguments  # type: ignore[union-attr]


def test_messages_stream_bytes_match_the_engine(stack: Stack) -> None:
    """Event by event, vLLM's own Anthropic stream reaches the client, but the model name."""
    body = {"model": "m-vllm", "max_tokens": 12, "messages": ASK, "stream": True}
    with stack.client() as client, client.stream("POST", "/v1/messages", json=body) as response:
        received = response.read()
    path, sent = stack.taps["vllm"].bodies[-1]
    assert path == "/v1/messages"
    assert received == sent.replace(b'"model":"up-vllm"', b'"model":"m-vllm"')
    assert b"event: message_stop" in received


def test_pinned_messages_on_llama_go_as_chat_and_keep_the_slot(
    stack: Stack, claude: anthropic.Anthropic
) -> None:
    """llama-server's /v1/messages ignores id_slot, so a session's turns go to its chat endpoint, pinned,
    and come back as Anthropic messages; the conversation's prefix is reused turn after turn."""
    conversation: list[Any] = [{"role": "user", "content": "Tell me about slot pinning."}]
    reused = []
    for turn in range(3):
        with claude.messages.stream(
            model="m-llama",
            max_tokens=8,
            messages=conversation,
            extra_headers={"x-session-id": "pinned-claude"},
        ) as stream:  # type: ignore[arg-type]
            final = stream.get_final_message()
        path, _ = stack.taps["llama"].bodies[-1]
        sent = json.loads(stack.taps["llama"].requests[-1])
        assert path == "/v1/chat/completions"
        assert isinstance(sent["id_slot"], int)
        assert final.model == "m-llama"
        reused.append(final.usage.cache_read_input_tokens or 0)
        text = "".join(block.text for block in final.content if block.type == "text")
        conversation += [
            {"role": "assistant", "content": text or "ok"},
            {"role": "user", "content": f"And {turn}?"},
        ]
    assert reused[0] == 0
    assert reused[1] > 0
    assert reused[2] > reused[1]
