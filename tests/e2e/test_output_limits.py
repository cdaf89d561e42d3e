"""The output limit a request asks for, judged at the gateway (issue #60 item 2): below 1 it is refused in
the client's API's words before any engine sees it; above the model's output limit (what ``/v1/models``
advertises) it is served up to that limit, and the answer says so (``x-turnout-output-capped``). A
``max_tokens`` of 10,000,000 used to reach the engine, which clamped it to its whole window."""

from __future__ import annotations

import json
from typing import Any

import pytest

from tests.e2e.conftest import Stack

MSG = [{"role": "user", "content": "hi"}]


def posts(stack: Stack) -> list[dict[str, Any]]:
    """Every generation request the simulators received, newest last."""
    bodies = []
    for tap in stack.taps.values():
        bodies += [
            json.loads(body) for path, body in tap.posts if "completions" in path or "messages" in path
        ]
    return bodies


def advertised(stack: Stack, model: str) -> int:
    with stack.client() as client:
        models = {m["id"]: m for m in client.get("/v1/models").json()["data"]}
    limit: int = models[model]["max_output_tokens"]
    return limit


@pytest.mark.parametrize(
    ("path", "field", "extra"),
    [
        ("/v1/chat/completions", "max_tokens", {"messages": MSG}),
        ("/v1/chat/completions", "max_completion_tokens", {"messages": MSG}),
        ("/v1/completions", "max_tokens", {"prompt": "hi"}),
        ("/v1/responses", "max_output_tokens", {"input": "hi"}),
    ],
)
@pytest.mark.parametrize("value", [0, -5])
def test_an_openai_limit_below_one_is_refused_in_openais_words(
    stack: Stack, path: str, field: str, extra: dict[str, Any], value: int
) -> None:
    before = len(posts(stack))
    with stack.client() as client:
        response = client.post(path, json={"model": "m-both", field: value, **extra})
    assert response.status_code == 400, response.text
    error = response.json()["error"]
    assert error["type"] == "invalid_request_error"
    assert error["param"] == field
    assert error["code"] == "integer_below_min_value"
    assert error["message"] == (
        f"Invalid '{field}': integer below minimum value. Expected a value >= 1, but got {value} instead."
    )
    assert len(posts(stack)) == before  # judged here: no engine saw it


@pytest.mark.parametrize("value", [0, -5])
def test_an_anthropic_limit_below_one_is_refused_in_anthropics_words(stack: Stack, value: int) -> None:
    with stack.client() as client:
        response = client.post("/v1/messages", json={"model": "m-both", "max_tokens": value, "messages": MSG})
    assert response.status_code == 400, response.text
    assert response.json() == {
        "type": "error",
        "error": {
            "type": "invalid_request_error",
            "message": "max_tokens: Input should be greater than or equal to 1",
        },
    }


@pytest.mark.parametrize(
    ("path", "field", "extra"),
    [
        ("/v1/chat/completions", "max_tokens", {"messages": MSG}),
        ("/v1/messages", "max_tokens", {"messages": MSG}),
        ("/v1/responses", "max_output_tokens", {"input": "hi"}),
    ],
)
def test_a_limit_above_the_models_is_served_up_to_it(
    stack: Stack, path: str, field: str, extra: dict[str, Any]
) -> None:
    limit = advertised(stack, "m-both")
    with stack.client() as client:
        response = client.post(path, json={"model": "m-both", field: 10_000_000, **extra})
    assert response.status_code == 200, response.text
    assert response.headers["x-turnout-output-capped"] == f"10000000 -> {limit}"
    sent = posts(stack)[-1]
    assert (
        max(v for k, v in sent.items() if k in ("max_tokens", "max_completion_tokens", "n_predict")) == limit
    )


def test_a_limit_within_the_models_is_sent_as_asked(stack: Stack) -> None:
    limit = advertised(stack, "m-both")
    with stack.client() as client:
        response = client.post(
            "/v1/chat/completions", json={"model": "m-both", "max_tokens": limit, "messages": MSG}
        )
    assert response.status_code == 200, response.text
    assert "x-turnout-output-capped" not in response.headers
    assert posts(stack)[-1]["max_tokens"] == limit
