"""Gateway-made errors on the agents' APIs: Anthropic's shape on /v1/messages, OpenAI's on /v1/responses."""

from __future__ import annotations

from typing import Any

import pytest

from tests.e2e.conftest import Stack

MSG = [{"role": "user", "content": "hi"}]


def assert_anthropic_error(response: Any, status: int, type_: str) -> str:
    assert response.status_code == status, response.text
    body = response.json()
    assert set(body) == {"type", "error"}
    assert body["type"] == "error"
    assert set(body["error"]) == {"type", "message"}
    assert body["error"]["type"] == type_
    message: str = body["error"]["message"]
    assert message
    return message


@pytest.mark.parametrize(
    ("body", "status", "type_", "words"),
    [
        ({"model": "gpt-9", "messages": MSG, "max_tokens": 5}, 404, "not_found_error", "m-both"),
        ({"model": "m-both", "messages": MSG}, 400, "invalid_request_error", "max_tokens"),
        ({"model": "m-both", "messages": MSG, "max_tokens": 0}, 400, "invalid_request_error", "max_tokens"),
        ({"model": "m-both", "messages": [], "max_tokens": 5}, 400, "invalid_request_error", "messages"),
        ({"messages": MSG, "max_tokens": 5}, 400, "invalid_request_error", "model"),
    ],
)
def test_messages_errors(stack: Stack, body: dict[str, Any], status: int, type_: str, words: str) -> None:
    with stack.client() as client:
        response = client.post(
            "/v1/messages?beta=true", json=body, headers={"x-api-key": "k", "anthropic-version": "2023-06-01"}
        )
    assert words in assert_anthropic_error(response, status, type_)


def test_messages_bad_json_and_unknown_subpath(stack: Stack) -> None:
    with stack.client() as client:
        bad = client.post("/v1/messages", content=b"{", headers={"content-type": "application/json"})
        missing = client.post("/v1/messages/nothing", json={})
    assert_anthropic_error(bad, 400, "invalid_request_error")
    assert_anthropic_error(missing, 404, "not_found_error")


def test_count_tokens_needs_messages(stack: Stack) -> None:
    with stack.client() as client:
        response = client.post("/v1/messages/count_tokens", json={"model": "m-both"})
    assert "messages" in assert_anthropic_error(response, 400, "invalid_request_error")


def test_responses_need_input(stack: Stack) -> None:
    with stack.client() as client:
        response = client.post("/v1/responses", json={"model": "m-both"})
    assert response.status_code == 400
    assert response.json()["error"]["param"] == "input"


def test_previous_response_id_is_refused_where_only_llama_serves(stack: Stack) -> None:
    body = {"model": "m-llama", "input": "go on", "previous_response_id": "resp_1"}
    with stack.client() as client:
        response = client.post("/v1/responses", json=body)
    assert response.status_code == 400
    error = response.json()["error"]
    assert error["param"] == "previous_response_id"
    assert "llama.cpp does not support 'previous_response_id'" in error["message"]


@pytest.mark.parametrize("stream", [False, True])
def test_an_unknown_previous_response_is_the_clients_error(stack: Stack, stream: bool) -> None:
    """vLLM keeps no such response and answers 404: the client hears OpenAI's 400
    ``previous_response_not_found`` (Codex then resends the conversation), not a 502."""
    body = {"model": "m-vllm", "input": "go on", "previous_response_id": "resp_gone", "stream": stream}
    with stack.client() as client:
        response = client.post("/v1/responses", json=body)
    assert response.status_code == 400
    error = response.json()["error"]
    assert (error["type"], error["code"], error["param"]) == (
        "invalid_request_error",
        "previous_response_not_found",
        "previous_response_id",
    )
    assert "resp_gone" in error["message"]
