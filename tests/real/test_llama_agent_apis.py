"""Agents' APIs through turnout to a real llama-server: the official SDKs, tool history, disconnect.

The server runs the tiny random qwen35 model with ``--jinja`` (tools need it). A random model does
not decide to call tools, so the tool legs send the tool call and its result as history, which is
the request shape an agent's second leg has.
"""

from __future__ import annotations

import itertools
import time
from collections.abc import Iterator
from typing import Any

import anthropic
import httpx
import openai
import pytest

from gateway.app import create_app
from gateway.settings import load_settings
from tests.real.llama_server import DEFAULT_ALIAS, LlamaServer, LlamaServerFactory
from tests.servers import ServerThread

pytestmark = [pytest.mark.real_llama, pytest.mark.timeout(300)]

MODEL = "tiny"
ASK = [{"role": "user", "content": "What is the weather in Lisbon?"}]
WEATHER = {
    "name": "get_weather",
    "description": "Weather for a city",
    "input_schema": {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]},
}


@pytest.fixture(scope="module")
def stack(llama_server_module: LlamaServerFactory) -> Iterator[tuple[LlamaServer, ServerThread]]:
    server = llama_server_module(n_parallel=2, ctx_total=4096, extra_args=["--jinja"])
    settings = load_settings(
        None,
        backends=[
            {
                "id": "llama",
                "kind": "llamacpp",
                "url": server.base_url,
                "probe_interval_s": 0.2,
                "timeouts": {"probe": 10.0},
            }
        ],
        models=[{"name": MODEL, "deployments": [{"backend": "llama", "upstream_name": DEFAULT_ALIAS}]}],
    )
    gateway = ServerThread(create_app(settings)).start()
    try:
        yield server, gateway
    finally:
        gateway.stop()


def test_anthropic_sdk(stack: tuple[LlamaServer, ServerThread]) -> None:
    _, gateway = stack
    claude = anthropic.Anthropic(base_url=gateway.url, api_key="unused", max_retries=0, timeout=120)
    message = claude.messages.create(model=MODEL, max_tokens=6, messages=ASK)  # type: ignore[arg-type]
    assert message.model == MODEL
    assert message.usage.output_tokens <= 6
    with claude.messages.stream(model=MODEL, max_tokens=6, messages=ASK) as stream:  # type: ignore[arg-type]
        list(stream.text_stream)
        final = stream.get_final_message()
    assert final.usage.output_tokens > 0
    counted = claude.messages.count_tokens(model=MODEL, messages=ASK)  # type: ignore[arg-type]
    assert counted.input_tokens == message.usage.input_tokens + (message.usage.cache_read_input_tokens or 0)
    call = {"type": "tool_use", "id": "toolu_1", "name": "get_weather", "input": {"city": "Lisbon"}}
    result = {"type": "tool_result", "tool_use_id": "toolu_1", "content": "Sunny, 24 C"}
    history: list[Any] = [
        *ASK,
        {"role": "assistant", "content": [call]},
        {"role": "user", "content": [result]},
    ]
    answer = claude.messages.create(model=MODEL, max_tokens=6, messages=history, tools=[WEATHER])  # type: ignore[list-item]
    assert answer.stop_reason in ("end_turn", "max_tokens", "tool_use")


def test_responses_sdk(stack: tuple[LlamaServer, ServerThread]) -> None:
    _, gateway = stack
    codex = openai.OpenAI(base_url=gateway.url + "/v1", api_key="unused", max_retries=0, timeout=120)
    response = codex.responses.create(model=MODEL, input="Say something.", max_output_tokens=6)
    assert response.model == MODEL
    assert response.usage is not None
    events = list(
        codex.responses.create(model=MODEL, input="Say something.", max_output_tokens=6, stream=True)
    )
    assert events[0].type == "response.created"
    assert events[-1].type == "response.completed"
    tool = {"type": "function", "name": "get_weather", "parameters": WEATHER["input_schema"]}
    history: list[Any] = [
        *ASK,
        {
            "type": "function_call",
            "call_id": "call_1",
            "name": "get_weather",
            "arguments": '{"city": "Lisbon"}',
        },
        {"type": "function_call_output", "call_id": "call_1", "output": "Sunny, 24 C"},
    ]
    answer = codex.responses.create(model=MODEL, input=history, tools=[tool], max_output_tokens=6)  # type: ignore[list-item]
    assert answer.status in ("completed", "incomplete")


@pytest.mark.parametrize(
    ("path", "body"),
    [
        ("/v1/messages", {"max_tokens": 1500, "messages": ASK}),
        ("/v1/responses", {"max_output_tokens": 1500, "input": "Go on and on."}),
    ],
)
def test_disconnect_frees_the_slot(
    stack: tuple[LlamaServer, ServerThread], path: str, body: dict[str, Any]
) -> None:
    server, gateway = stack
    with httpx.Client(base_url=gateway.url, timeout=120) as client:
        with client.stream("POST", path, json={**body, "model": MODEL, "stream": True}) as response:
            assert response.status_code == 200
            chunks = response.iter_raw()
            for _ in range(3):
                next(chunks)
            assert any(slot["is_processing"] for slot in httpx.get(server.base_url + "/slots").json())
        closed = time.monotonic()
    while time.monotonic() - closed < 30:  # ends as soon as the slot is free
        if not any(slot["is_processing"] for slot in httpx.get(server.base_url + "/slots").json()):
            break
        time.sleep(0.05)
    slots = httpx.get(server.base_url + "/slots").json()
    assert not any(slot["is_processing"] for slot in slots)
    # freed by the cancel, not by the answer's end
    assert max(slot.get("next_token", [{}])[0].get("n_decoded", 0) for slot in slots) < 1500


def test_anthropic_session_keeps_its_slot_and_reuse(stack: tuple[LlamaServer, ServerThread]) -> None:
    """llama-server's /v1/messages ignores id_slot; turnout sends pinned turns as chat and translates back."""
    _, gateway = stack
    claude = anthropic.Anthropic(base_url=gateway.url, api_key="unused", max_retries=0, timeout=120)
    conversation: list[Any] = [{"role": "user", "content": "Tell me about slot pinning."}]
    slots, reused = set(), []
    for turn in range(4):
        raw = claude.messages.with_raw_response.create(
            model=MODEL, max_tokens=6, messages=conversation, extra_headers={"x-session-id": "claude-real"}
        )
        slots.add(raw.headers["x-turnout-slot"])
        message = raw.parse()
        reused.append(message.usage.cache_read_input_tokens or 0)
        text = "".join(block.text for block in message.content if block.type == "text")
        conversation += [
            {"role": "assistant", "content": text or "ok"},
            {"role": "user", "content": f"Turn {turn}?"},
        ]
    assert len(slots) == 1
    assert reused[0] == 0
    assert all(later > earlier for earlier, later in itertools.pairwise(reused[1:]))
    assert reused[1] > 0
