"""Upstream failures: translated before the first byte (and re-routed), an error event after it."""

from __future__ import annotations

import json
from collections.abc import Iterator

import pytest

from tests.e2e.conftest import Stack, start_stack, stop_stack
from tests.e2e.faulty import Fault, create_faulty_app
from tests.e2e.test_errors import assert_openai_error, post
from tests.servers import ServerThread

MSG = [{"role": "user", "content": "hi"}]


@pytest.fixture(scope="module")
def faulty() -> Iterator[tuple[Stack, Fault]]:
    fault = Fault()
    server = ServerThread(create_faulty_app(fault)).start()
    running = start_stack(
        profile="least-loaded",  # ties keep configured order, so the faulty backend is tried first
        extra_backends=[{"id": "faulty", "kind": "openai", "url": server.url, "probe_interval_s": 60}],
        extra_models=[
            {"name": "m-faulty", "deployments": [{"backend": "faulty", "upstream_name": "up-faulty"}]},
            {
                "name": "m-fallback",
                "deployments": [
                    {"backend": "faulty", "upstream_name": "up-faulty"},
                    {"backend": "llama", "upstream_name": "up-llama"},
                ],
            },
        ],
    )
    try:
        yield running, fault
    finally:
        stop_stack(running)
        server.stop()


def set_fault(fault: Fault, status: int = 200, body: object = b"", events: int | None = None) -> None:
    fault.status = status
    fault.body = body if isinstance(body, bytes) else json.dumps(body).encode()
    fault.events_before_break = events


def test_vllm_style_unauthorized_becomes_502(faulty: tuple[Stack, Fault]) -> None:
    stack, fault = faulty
    set_fault(fault, 401, {"error": "Unauthorized"})
    error = assert_openai_error(post(stack, {"model": "m-faulty", "messages": MSG}), 502, "upstream_error")
    assert error["message"] == "backend faulty answered 401: Unauthorized"


def test_llama_context_error_keeps_status_and_says_so(faulty: tuple[Stack, Fault]) -> None:
    stack, fault = faulty
    message = "request (9000 tokens) exceeds the available context size (8192 tokens), try increasing it"
    set_fault(fault, 400, {"error": {"code": 400, "message": message, "type": "exceed_context_size_error"}})
    error = assert_openai_error(
        post(stack, {"model": "m-faulty", "messages": MSG}), 400, "invalid_request_error"
    )
    assert (error["message"], error["code"]) == (message, "context_length_exceeded")


def test_server_error_is_retried_on_another_backend(faulty: tuple[Stack, Fault]) -> None:
    """A 5xx before the first byte re-routes; the client never sees the failure."""
    stack, fault = faulty
    set_fault(fault, 500, {"error": {"message": "boom", "type": "server_error"}})
    calls = len(fault.calls)
    response = post(stack, {"model": "m-fallback", "messages": MSG, "max_tokens": 3})
    assert response.status_code == 200
    assert response.headers["x-turnout-backend"] == "llama"
    assert len(fault.calls) == calls + 1


def test_failure_after_streaming_began_ends_with_an_error_event(faulty: tuple[Stack, Fault]) -> None:
    stack, fault = faulty
    set_fault(fault, events=2)
    body = {"model": "m-faulty", "messages": MSG, "stream": True}
    with stack.client() as client, client.stream("POST", "/v1/chat/completions", json=body) as response:
        assert response.status_code == 200
        events = [e for e in response.read().split(b"\n\n") if e]
    assert len(events) == 4
    assert all(b'"content":"hi"' in e for e in events[:2])
    error = json.loads(events[2].removeprefix(b"data: "))["error"]
    assert error["type"] == "upstream_error"
    assert "faulty" in error["message"]
    assert events[3] == b"data: [DONE]"
