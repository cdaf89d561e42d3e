"""Every gateway-made error: OpenAI error JSON with the right status."""

from __future__ import annotations

import re
import socket
from collections.abc import Iterator
from typing import Any

import httpx
import pytest

from backends.sim import SimConfig
from gateway.requests import MAX_DEPTH
from tests.e2e.conftest import Stack, start_stack, stop_stack
from tests.servers import ADMIN


def assert_openai_error(response: Any, status: int, type_: str, code: str | None = None) -> dict[str, Any]:
    assert response.status_code == status, response.text
    assert response.headers["content-type"].startswith("application/json")
    error = response.json()["error"]
    assert set(error) == {"message", "type", "param", "code"}
    assert error["type"] == type_
    assert isinstance(error["message"], str)
    assert error["message"]
    if code is not None:
        assert error["code"] == code
    return dict(error)


def post(stack: Stack, body: Any, path: str = "/v1/chat/completions", **kwargs: Any) -> Any:
    with stack.client() as client:
        if isinstance(body, bytes | str):
            return client.post(path, content=body, headers={"content-type": "application/json"}, **kwargs)
        return client.post(path, json=body, **kwargs)


MSG = [{"role": "user", "content": "hi"}]


def nested(depth: int) -> dict[str, Any]:
    """Objects nested ``depth`` deep."""
    value: dict[str, Any] = {"type": "string"}
    for _ in range(depth - 1):
        value = {"p": value}
    return value


def with_tool(schema: dict[str, Any]) -> dict[str, Any]:
    """A chat request whose one tool takes ``schema``: 4 levels (body, tools, tool, function) above it."""
    tool = {"type": "function", "function": {"name": "f", "parameters": schema}}
    return {"model": "m-vllm", "messages": MSG, "tools": [tool]}


def test_unknown_model_lists_valid_names(stack: Stack) -> None:
    error = assert_openai_error(
        post(stack, {"model": "gpt-9", "messages": MSG}), 404, "invalid_request_error"
    )
    assert error["code"] == "model_not_found"
    assert error["param"] == "model"
    for name in ("m-vllm", "m-llama", "m-both", "both"):
        assert name in error["message"]


@pytest.mark.parametrize(
    ("body", "param"),
    [
        (b"{not json", None),
        (b"", None),
        (b"[1, 2]", None),
        ({"messages": MSG}, "model"),
        ({"model": 3, "messages": MSG}, "model"),
        ({"model": "m-vllm"}, "messages"),
        ({"model": "m-vllm", "messages": []}, "messages"),
        ({"model": "m-vllm", "messages": ["hi"]}, "messages[0]"),
        ({"model": "m-vllm", "messages": MSG, "max_tokens": "ten"}, "max_tokens"),
        ({"model": "m-vllm", "messages": MSG, "stream": "yes"}, "stream"),
        (b'{"model": "m-vllm", "messages": ' + b"[" * 3000 + b"]" * 3000 + b"}", None),  # the decoder's limit
        (with_tool(nested(600)), None),  # decodes, but reading the prompt would recurse 600 deep
    ],
    ids=lambda v: str(v)[:40],
)
def test_bad_requests(stack: Stack, body: Any, param: str | None) -> None:
    error = assert_openai_error(post(stack, body), 400, "invalid_request_error")
    assert error["param"] == param


def test_bodies_nest_up_to_the_limit(stack: Stack) -> None:
    """A tool schema as deep as the limit allows is relayed; one level more is refused (400, not 500)."""
    deepest = with_tool(nested(MAX_DEPTH - 4))
    assert post(stack, deepest).status_code == 200
    error = assert_openai_error(post(stack, with_tool(nested(MAX_DEPTH - 3))), 400, "invalid_request_error")
    assert f"more than {MAX_DEPTH} levels" in error["message"]


def test_completions_need_a_prompt(stack: Stack) -> None:
    error = assert_openai_error(
        post(stack, {"model": "m-vllm"}, "/v1/completions"), 400, "invalid_request_error"
    )
    assert error["param"] == "prompt"


def test_unknown_path_and_method(stack: Stack) -> None:
    with stack.client() as client:
        assert_openai_error(client.get("/v1/nothing"), 404, "not_found_error")
        assert_openai_error(client.get("/v1/chat/completions"), 405, "invalid_request_error")


def test_context_too_long_for_every_backend(stack: Stack) -> None:
    """Refused on the engine's count (not the estimate), in each API's words: what agents match on
    to compact and retry."""
    long_prompt = [{"role": "user", "content": "word " * 200_000}]
    counted = httpx.post(
        stack.sims["vllm"].url + "/tokenize", json={"model": "up-vllm", "messages": long_prompt}
    ).json()["count"]
    error = assert_openai_error(
        post(stack, {"model": "m-both", "messages": long_prompt}), 400, "invalid_request_error"
    )
    assert (error["code"], error["param"]) == ("context_length_exceeded", "messages")
    assert error["message"].startswith(
        f"This model's maximum context length is 32768 tokens. However, your messages resulted in "
        f"{counted} tokens."
    )
    with stack.client() as client:
        anthropic = client.post(
            "/v1/messages", json={"model": "m-both", "max_tokens": 10, "messages": long_prompt}
        )
        responses = client.post("/v1/responses", json={"model": "m-both", "input": "word " * 200_000})
    assert anthropic.status_code == 400
    assert anthropic.json()["error"]["type"] == "invalid_request_error"
    assert re.fullmatch(
        r"prompt is too long: \d+ tokens > 32768 maximum", anthropic.json()["error"]["message"]
    )
    response_error = assert_openai_error(responses, 400, "invalid_request_error")
    assert (response_error["code"], response_error["param"]) == ("context_length_exceeded", "input")
    with stack.client() as client:
        logged = client.get("/admin/api/decisions", headers=ADMIN, params={"limit": 1}).json()["data"][0]
    assert (logged["endpoint"], logged["chosen"], logged["status"]) == ("responses", None, 400)
    assert logged["error"].startswith("This model's maximum context length is 32768 tokens.")
    assert {r["reason"] for r in logged["rejected"]} == {"context-too-long"}


@pytest.fixture(scope="module")
def limited() -> Iterator[Stack]:
    """A stack with a small body limit, a vLLM that wants a key turnout does not have, and a dead backend."""
    running = start_stack(
        vllm=SimConfig(kind="vllm", model="up-vllm", time_scale=0.002, api_key="secret"),
        extra_backends=[
            {"id": "dead", "kind": "openai", "url": "http://127.0.0.1:9", "probe_interval_s": 60}
        ],
        extra_models=[{"name": "m-dead", "deployments": [{"backend": "dead", "upstream_name": "x"}]}],
        limits={"max_body_bytes": 2048, "retries": 0, "body_timeout_s": 3, "max_header_bytes": 16384},
    )
    try:
        yield running
    finally:
        stop_stack(running)


def test_body_over_limit(limited: Stack) -> None:
    body = {"model": "m-llama", "messages": [{"role": "user", "content": "x" * 4096}]}
    assert_openai_error(post(limited, body), 413, "invalid_request_error", "request_too_large")


def test_backend_refusing_turnouts_key_is_unavailable(limited: Stack) -> None:
    """The probe meets vLLM's 401 on /v1/models, so the backend is down and the client hears why."""
    error = assert_openai_error(
        post(limited, {"model": "m-vllm", "messages": MSG}), 503, "service_unavailable_error"
    )
    assert "vllm" in error["message"]
    assert "401" in error["message"]


def test_dead_backend(limited: Stack) -> None:
    error = assert_openai_error(
        post(limited, {"model": "m-dead", "messages": MSG}), 503, "service_unavailable_error"
    )
    assert error["code"] == "no_backend_available"
    assert "dead: backend is down" in error["message"]


def test_headers_over_the_limit_are_431_in_the_apis_shape(limited: Stack) -> None:
    big = {"x-padding": "a" * 20_000}
    openai_style = httpx.post(limited.url + "/v1/chat/completions", json={}, headers=big)
    error = assert_openai_error(openai_style, 431, "invalid_request_error")
    assert "limit of 16384" in error["message"]
    anthropic_style = httpx.post(limited.url + "/v1/messages", json={}, headers=big)
    assert anthropic_style.status_code == 431
    assert anthropic_style.json()["type"] == "error"


def test_a_body_that_trickles_in_gets_408(limited: Stack) -> None:
    """A client that sends its headers and then stalls holds nothing past ``limits.body_timeout_s``."""
    with socket.create_connection(("127.0.0.1", limited.gateway.port), timeout=30) as conn:
        conn.sendall(
            b"POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\ncontent-type: application/json\r\n"
            b'content-length: 100\r\n\r\n{"model":'
        )
        answer = read_answer(conn)
    assert answer.startswith(b"HTTP/1.1 408")
    assert b"did not arrive within 3 s" in answer


def read_answer(conn: socket.socket) -> bytes:
    """One whole HTTP answer: its headers and ``content-length`` bytes of body (they may arrive in
    separate segments on a busy machine)."""
    answer = b""
    while b"\r\n\r\n" not in answer and (chunk := conn.recv(4096)):
        answer += chunk
    head, _, body = answer.partition(b"\r\n\r\n")
    length = next(
        (
            int(line.split(b":")[1])
            for line in head.split(b"\r\n")
            if line.lower().startswith(b"content-length:")
        ),
        0,
    )
    while len(body) < length and (chunk := conn.recv(4096)):
        body += chunk
    return head + b"\r\n\r\n" + body


@pytest.mark.parametrize(
    ("model", "path", "field"),
    [
        ("m-vllm", "/v1/chat/completions", "max_tokens"),
        ("m-vllm", "/v1/chat/completions", "max_completion_tokens"),
        ("m-llama", "/v1/chat/completions", "max_tokens"),
        ("m-vllm", "/v1/messages", "max_tokens"),
        ("m-llama", "/v1/messages", "max_tokens"),
        ("m-vllm", "/v1/responses", "max_output_tokens"),
    ],
)
def test_an_output_limit_beyond_the_models_is_capped_to_it(
    stack: Stack, model: str, path: str, field: str
) -> None:
    """``max_tokens: 10000000`` is lowered to the model's output limit, what ``/v1/models`` advertises
    (a quarter of the window with none configured), for whichever engine it chose: vLLM refused it
    with a 400 naming its own field, llama.cpp answered, and once capped to the window it reached
    the engine as the whole window (issue #60; docs/routing.md, "Output limits")."""
    prompt = {"input": "hi"} if path == "/v1/responses" else {"messages": MSG}
    response = post(stack, {"model": model, field: 10_000_000, **prompt}, path)
    assert response.status_code == 200, response.text
    sent = stack.taps[response.headers["x-turnout-backend"]].requests[-1]
    window = SimConfig().context_window  # the simulators' (probed: the config names none)
    limits = {k: v for k, v in httpx.Response(200, content=sent).json().items() if k in (field, "max_tokens")}
    assert limits
    assert all(value == window // 4 for value in limits.values()), limits
    assert response.headers["x-turnout-output-capped"] == f"10000000 -> {window // 4}"


def test_an_engine_refusal_says_which_backend_refused(stack: Stack) -> None:
    """A 400 the engine gave (here vLLM's for ``stream_options`` without ``stream``) is relayed with
    the decision's headers, like an answer."""
    body = {"model": "m-vllm", "messages": MSG, "stream_options": {"include_usage": True}}
    response = post(stack, body)
    assert_openai_error(response, 400, "invalid_request_error")
    assert response.headers["x-turnout-backend"] == "vllm"
    assert response.headers["x-turnout-route-reason"].startswith("only-candidate")
