"""``/v1/responses`` on both simulators (official ``openai`` SDK + raw)."""

from __future__ import annotations

import json

import openai
import pytest

from tests.backends.sim.simhelp import running
from tests.backends.sim.test_messages import events

WEATHER = {
    "type": "function",
    "name": "get_weather",
    "description": "Weather for a city",
    "parameters": {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]},
}


@pytest.mark.parametrize("kind", ["llamacpp", "vllm"])
def test_sdk_text_and_stream(kind: str) -> None:
    with running(kind) as (client, _):
        sdk = openai.OpenAI(base_url=str(client.base_url) + "/v1", api_key="x", max_retries=0)
        response = sdk.responses.create(model="sim-model", input="Say something.", instructions="Be brief.")
        assert response.status == "completed"
        assert response.output_text
        assert response.usage is not None
        assert response.usage.output_tokens > 0
        kinds = []
        text = ""
        # plain event iteration: the SDK's ``responses.stream()`` accumulator needs ``output_index`` /
        # ``content_index``, which llama.cpp's events (like the real server's) do not carry
        for event in sdk.responses.create(
            model="sim-model", input="Say something.", instructions="Be brief.", stream=True
        ):
            kinds.append(event.type)
            if event.type == "response.output_text.delta":
                text += event.delta
            if event.type == "response.completed":
                final = event.response
        assert kinds[:4] == [
            "response.created",
            "response.in_progress",
            "response.output_item.added",
            "response.content_part.added",
        ]
        assert kinds[-1] == "response.completed"
        assert text == response.output_text == final.output_text  # deterministic answer


@pytest.mark.parametrize("kind", ["llamacpp", "vllm"])
def test_function_call_items(kind: str) -> None:
    with running(kind) as (client, _):
        body = {"model": "sim-model", "input": "Weather in Paris?", "tools": [WEATHER]}
        response = client.post("/v1/responses", json=body).json()
        call = response["output"][-1]
        assert call["type"] == "function_call"
        assert call["name"] == "get_weather"
        raw = client.post("/v1/responses", json=body | {"stream": True}).text
        seq = events(raw)
        args = "".join(d["delta"] for e, d in seq if e == "response.function_call_arguments.delta")
        assert json.loads(args) == json.loads(call["arguments"])
        names = [e for e, _ in seq]
        assert "response.output_item.added" in names
        assert names[-1] == "response.completed"
        assert ("response.function_call_arguments.done" in names) == (kind == "vllm")
        assert "[DONE]" not in raw
        follow = body | {
            "input": [
                {"role": "user", "content": "Weather in Paris?"},
                {"type": "function_call", "call_id": call["call_id"], "name": call["name"],
                 "arguments": call["arguments"]},
                {"type": "function_call_output", "call_id": call["call_id"], "output": "sunny"},
            ]
        }  # fmt: skip
        answer = client.post("/v1/responses", json=follow).json()
        assert answer["output"][0]["type"] == "message"


def test_llama_honours_id_slot_and_cache_prompt() -> None:
    """llama.cpp copies the Responses body, so ``id_slot`` and ``cache_prompt`` reach the task."""
    with running("llamacpp", slots=2) as (client, engine):
        body = {"input": "Pin me to a slot please.", "max_output_tokens": 2}
        for slot in (1, 0, 1):
            client.post("/v1/responses", json=body | {"id_slot": slot})
        starts = [e.slot for e in engine.events if e.kind.value == "start"]
        assert starts == [1, 0, 1]
        again = client.post("/v1/responses", json=body | {"id_slot": 1}).json()
        assert again["usage"]["input_tokens_details"]["cached_tokens"] > 0
        cold = client.post("/v1/responses", json=body | {"id_slot": 1, "cache_prompt": False}).json()
        assert cold["usage"]["input_tokens_details"]["cached_tokens"] == 0
        count = client.post("/v1/responses/input_tokens", json=body).json()
        assert count == {"input_tokens": again["usage"]["input_tokens"], "object": "response.input_tokens"}


def test_errors() -> None:
    with running("llamacpp") as (client, _):
        previous = client.post("/v1/responses", json={"input": "x", "previous_response_id": "resp_1"})
        assert previous.status_code == 400
        assert previous.json()["error"]["message"] == "llama.cpp does not support 'previous_response_id'."
        assert (
            client.post("/v1/responses", json={"model": "x"}).json()["error"]["message"]
            == "'input' is required"
        )
    with running("vllm", context_window=64) as (client, _):
        previous = client.post("/v1/responses", json={"input": "x", "previous_response_id": "resp_1"})
        assert previous.status_code == 404
        assert previous.json()["error"]["param"] == "response_id"
        long = client.post("/v1/responses", json={"input": "route " * 200})  # > 64 * 13 characters
        assert long.status_code == 400
        assert long.json()["error"]["param"] == "input_text"
        long = client.post("/v1/responses", json={"input": "route " * 100})  # > 64 tokens
        assert long.status_code == 400
        assert long.json()["error"]["param"] == "input_tokens"
        assert "at least 65 input tokens" in long.json()["error"]["message"]
        missing = client.post("/v1/responses", json={"model": "sim-model"})
        assert missing.status_code == 400
        assert missing.json()["error"]["type"] == "Bad Request"


def test_vllm_incomplete_on_max_output_tokens() -> None:
    with running("vllm") as (client, _):
        response = client.post(
            "/v1/responses", json={"input": "Say something.", "max_output_tokens": 3}
        ).json()
        assert response["status"] == "incomplete"
        assert response["incomplete_details"] == {"reason": "max_output_tokens"}
        assert response["max_output_tokens"] == 3
        assert response["usage"]["output_tokens"] == 3
