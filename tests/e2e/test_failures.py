"""Upstream failures: translated before the first byte (and re-routed), an error event after it."""

from __future__ import annotations

import json
import time
from collections.abc import Iterator

import httpx
import pytest

from backends import stream
from tests.e2e.conftest import Stack, start_stack, stop_stack
from tests.e2e.faulty import Fault, create_faulty_app
from tests.e2e.test_errors import assert_openai_error, post
from tests.servers import ADMIN, ServerThread

MSG = [{"role": "user", "content": "hi"}]


@pytest.fixture(scope="module")
def faulty() -> Iterator[tuple[Stack, Fault]]:
    fault = Fault()
    server = ServerThread(create_faulty_app(fault)).start()
    running = start_stack(
        profile="least-loaded",  # ties keep configured order, so the faulty backend is tried first
        extra_backends=[
            {
                "id": "faulty",
                "kind": "openai",
                "url": server.url,
                "probe_interval_s": 0.2,
                "circuit": {"failures": 100},
            }  # each test sees the failures it makes (test_deadlines: breaking)
        ],
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


def set_fault(
    stack: Stack,
    fault: Fault,
    status: int = 200,
    body: object = b"",
    events: int | None = None,
    media_type: str = "application/json",
    events_then_end: int | None = None,
    garbage: bytes = b"",
) -> None:
    """The next requests fail so; the faulty backend is back up first (a stream that broke off
    marked it down until a probe found it again)."""
    fault.status = status
    fault.body = body if isinstance(body, bytes) else json.dumps(body).encode()
    fault.events_before_break = events
    fault.media_type, fault.events_then_end, fault.garbage = media_type, events_then_end, garbage
    deadline = time.monotonic() + 30
    while httpx.get(stack.url + "/health", timeout=30).json()["backends"]["faulty"] != "ready":
        assert time.monotonic() < deadline, "the faulty backend was not probed back up"
        time.sleep(0.05)


def test_vllm_style_unauthorized_becomes_502(faulty: tuple[Stack, Fault]) -> None:
    stack, fault = faulty
    set_fault(stack, fault, 401, {"error": "Unauthorized"})
    error = assert_openai_error(post(stack, {"model": "m-faulty", "messages": MSG}), 502, "upstream_error")
    assert error["message"] == "backend faulty answered 401: Unauthorized"


def test_engine_context_error_is_the_apis_overflow_error(faulty: tuple[Stack, Fault]) -> None:
    """An engine that refuses the prompt as too long, with no other backend for the model: the
    client gets OpenAI's ``context_length_exceeded`` (Anthropic's "prompt is too long" on
    ``/v1/messages``) with the engine's own count and window."""
    stack, fault = faulty
    message = "request (9000 tokens) exceeds the available context size (8192 tokens), try increasing it"
    error = {"code": 400, "message": message, "type": "exceed_context_size_error"}
    set_fault(stack, fault, 400, {"error": {**error, "n_prompt_tokens": 9000, "n_ctx": 8192}})
    body = assert_openai_error(
        post(stack, {"model": "m-faulty", "messages": MSG}), 400, "invalid_request_error"
    )
    assert body["code"] == "context_length_exceeded"
    assert body["message"].startswith(
        "This model's maximum context length is 8192 tokens. However, your messages resulted in 9000 tokens."
    )
    assert message in body["message"]
    with stack.client() as client:
        anthropic = client.post("/v1/messages", json={"model": "m-faulty", "max_tokens": 5, "messages": MSG})
    assert anthropic.status_code == 400
    assert anthropic.json() == {
        "type": "error",
        "error": {
            "type": "invalid_request_error",
            "message": "prompt is too long: 9000 tokens > 8192 maximum",
        },
    }
    set_fault(stack, fault, 400, {"error": error})  # no numbers: the engine's words, with the same code
    body = assert_openai_error(
        post(stack, {"model": "m-faulty", "messages": MSG}), 400, "invalid_request_error"
    )
    assert (body["code"], message in body["message"]) == ("context_length_exceeded", True)


def test_prompt_an_engine_refuses_as_too_long_goes_to_a_larger_window(faulty: tuple[Stack, Fault]) -> None:
    """Nothing reached the client yet: the engine's refusal re-routes to the model's other backend,
    and the decision log names the backend that was too small."""
    stack, fault = faulty
    message = "request (9000 tokens) exceeds the available context size (8192 tokens), try increasing it"
    error = {"code": 400, "message": message, "type": "exceed_context_size_error"}
    set_fault(stack, fault, 400, {"error": {**error, "n_prompt_tokens": 12, "n_ctx": 8}})
    response = post(stack, {"model": "m-fallback", "messages": MSG, "max_tokens": 3})
    assert response.status_code == 200
    assert response.headers["x-turnout-backend"] == "llama"
    with stack.client() as client:
        entry = client.get("/admin/api/decisions", headers=ADMIN, params={"limit": 1}).json()["data"][0]
    assert entry["chosen"] == "llama"
    assert entry["prompt_tokens_estimate"] == 12  # the engine's count replaced the estimate
    assert {"backend": "faulty", "reason": "context-too-long"}.items() <= entry["rejected"][-1].items()


def test_server_error_is_retried_on_another_backend(faulty: tuple[Stack, Fault]) -> None:
    """A 5xx before the first byte re-routes; the client never sees the failure."""
    stack, fault = faulty
    set_fault(stack, fault, 500, {"error": {"message": "boom", "type": "server_error"}})
    calls = len(fault.calls)
    response = post(stack, {"model": "m-fallback", "messages": MSG, "max_tokens": 3})
    assert response.status_code == 200
    assert response.headers["x-turnout-backend"] == "llama"
    assert len(fault.calls) == calls + 1


def test_failure_after_streaming_began_ends_with_an_error_event(faulty: tuple[Stack, Fault]) -> None:
    stack, fault = faulty
    set_fault(stack, fault, events=2)
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


def test_responses_stream_failure_is_a_response_failed_event(faulty: tuple[Stack, Fault]) -> None:
    """Codex reads ``response.failed`` (and ignores a bare ``error`` event, retrying the turn)."""
    stack, fault = faulty
    set_fault(stack, fault, events=1)
    body = {"model": "m-faulty", "input": "hi", "stream": True}
    with stack.client() as client, client.stream("POST", "/v1/responses", json=body) as response:
        assert response.status_code == 200
        events = [e for e in response.read().split(b"\n\n") if e]
    assert len(events) == 2
    name, data = events[1].split(b"\n", 1)
    assert name == b"event: response.failed"
    failed = json.loads(data.removeprefix(b"data: "))
    assert failed["type"] == "response.failed"
    assert failed["response"]["status"] == "failed"
    assert failed["response"]["error"]["code"] == "upstream_failed"
    assert "faulty" in failed["response"]["error"]["message"]


HTML = b"<html><body><h1>502 Bad Gateway</h1></body></html>"


def test_a_plain_answer_that_is_not_json_is_a_clear_502(faulty: tuple[Stack, Fault]) -> None:
    stack, fault = faulty
    set_fault(stack, fault, 200, HTML, media_type="text/html")
    error = assert_openai_error(post(stack, {"model": "m-faulty", "messages": MSG}), 502, "upstream_error")
    assert "not JSON (text/html" in error["message"]


def test_an_html_page_for_a_stream_goes_to_another_backend(faulty: tuple[Stack, Fault]) -> None:
    """Nothing was sent to the client yet: the stream request goes where an event stream comes from."""
    stack, fault = faulty
    set_fault(stack, fault, 200, HTML, media_type="text/html")
    body = {"model": "m-fallback", "messages": MSG, "stream": True, "max_tokens": 3}
    with stack.client() as client, client.stream("POST", "/v1/chat/completions", json=body) as response:
        assert response.status_code == 200
        assert response.headers["x-turnout-backend"] == "llama"
        assert response.read().endswith(b"data: [DONE]\n\n")


def test_a_stream_that_ends_without_done_ends_with_an_error_event(faulty: tuple[Stack, Fault]) -> None:
    stack, fault = faulty
    set_fault(stack, fault, events_then_end=2)
    body = {"model": "m-faulty", "messages": MSG, "stream": True}
    with stack.client() as client, client.stream("POST", "/v1/chat/completions", json=body) as response:
        events = [e for e in response.read().split(b"\n\n") if e]
    assert len(events) == 4
    error = json.loads(events[2].removeprefix(b"data: "))["error"]
    assert "ended the stream without its last event ([DONE])" in error["message"]
    assert events[3] == b"data: [DONE]"  # turnout's own clean end


def test_a_stream_with_lines_no_event_stream_has_ends_with_an_error_event(
    faulty: tuple[Stack, Fault],
) -> None:
    stack, fault = faulty
    set_fault(stack, fault, events_then_end=3, garbage=b"<html>Internal Server Error</html>\n\n")
    body = {"model": "m-faulty", "messages": MSG, "stream": True}
    with stack.client() as client, client.stream("POST", "/v1/chat/completions", json=body) as response:
        events = [e for e in response.read().split(b"\n\n") if e]
    assert b'"content":"hi"' in events[0]
    error = json.loads(events[1].removeprefix(b"data: "))["error"]
    assert "a line that is no event-stream field: b'<html>" in error["message"]
    assert not any(e.startswith(b"<html>") for e in events)  # relayed only as quoted in the error


def test_a_plain_answer_over_the_size_limit_is_a_clear_502(
    faulty: tuple[Stack, Fault], monkeypatch: pytest.MonkeyPatch
) -> None:
    """An engine gone wrong that answers without end: read no further than MAX_BODY_BYTES."""
    monkeypatch.setattr(stream, "MAX_BODY_BYTES", 1 << 20)
    stack, fault = faulty
    set_fault(stack, fault, 200, b'{"pad":"' + b"x" * (2 << 20) + b'"}')
    error = assert_openai_error(post(stack, {"model": "m-faulty", "messages": MSG}), 502, "upstream_error")
    assert "answered with more than 1,048,576 bytes" in error["message"]


def test_an_event_over_the_size_limit_ends_the_stream_with_an_error_event(
    faulty: tuple[Stack, Fault], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(stream, "MAX_EVENT_BYTES", 64 << 10)
    stack, fault = faulty
    set_fault(stack, fault, events_then_end=2, garbage=b"data: " + b"x" * (200 << 10))  # never ends
    body = {"model": "m-faulty", "messages": MSG, "stream": True}
    with stack.client() as client, client.stream("POST", "/v1/chat/completions", json=body) as response:
        events = [e for e in response.read().split(b"\n\n") if e]
    error = json.loads(events[1].removeprefix(b"data: "))["error"]
    assert "sent an event larger than 65,536 bytes" in error["message"]
