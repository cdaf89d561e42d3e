"""Silent and failing engines: a hung one is left for another backend, a queued one is waited for, a
stalled stream ends with an error event (``backends.watchdog``), one that keeps failing is taken out
for a cool-down and tried again once (``backends.breaker``)."""

from __future__ import annotations

import json
import threading
import time
from collections.abc import Iterator
from typing import Any

import httpx
import pytest

from backends.sim import SimConfig
from tests.e2e.conftest import Stack, start_stack, stop_stack
from tests.e2e.faulty import Fault, create_faulty_app
from tests.servers import ADMIN, ServerThread

MSG = [{"role": "user", "content": "hi"}]
FAST = {"first_byte": 0.5, "stream_idle": 0.5, "read": 8.0}
COOL_DOWN_S = 5.0  # long enough for a loaded machine to look at the open circuit before it half-opens


def until(condition: Any, what: str, timeout: float = 30.0) -> None:
    deadline = time.monotonic() + timeout
    while not condition():
        assert time.monotonic() < deadline, f"never: {what}"
        time.sleep(0.05)


@pytest.fixture
def hung() -> Iterator[tuple[Stack, Fault]]:
    """A vLLM-like engine (load from /metrics) that does what ``Fault`` says, before llama.cpp."""
    fault = Fault()
    server = ServerThread(create_faulty_app(fault)).start()
    running = start_stack(
        profile="least-loaded",  # ties keep configured order: the faulty engine is tried first
        extra_backends=[
            {"id": "faulty", "kind": "vllm", "url": server.url, "probe_interval_s": 0.2, "timeouts": FAST,
             "circuit": {"failures": 2, "cool_down_s": COOL_DOWN_S}}
        ],
        extra_models=[
            {"name": "m-hung", "deployments": [{"backend": "faulty", "upstream_name": "up-faulty"},
                                               {"backend": "llama", "upstream_name": "up-llama"}]},
            {"name": "m-hung-only", "deployments": [{"backend": "faulty", "upstream_name": "up-faulty"}]},
        ],
    )  # fmt: skip
    try:
        yield running, fault
    finally:
        stop_stack(running)
        server.stop()


def last_decision(stack: Stack) -> dict[str, Any]:
    return httpx.get(stack.url + "/admin/api/decisions?limit=1", headers=ADMIN, timeout=30).json()["data"][0]


def faulty_backend(stack: Stack) -> dict[str, Any]:
    backends = httpx.get(stack.url + "/admin/api/overview", headers=ADMIN, timeout=30).json()["backends"]
    return next(b for b in backends if b["id"] == "faulty")


def circuit(stack: Stack) -> str:
    return str(httpx.get(stack.url + "/health", timeout=30).json()["circuits"]["faulty"])


def test_a_hung_engine_is_left_for_another_backend(hung: tuple[Stack, Fault]) -> None:
    """It accepts the request and never answers, while reporting nothing running: after
    ``first_byte`` seconds the request goes to llama.cpp (nothing had reached the client)."""
    stack, fault = hung
    fault.hang = True
    started = time.monotonic()
    answer = httpx.post(
        stack.url + "/v1/chat/completions", json={"model": "m-hung", "messages": MSG}, timeout=30
    )
    took = time.monotonic() - started
    assert answer.status_code == 200
    assert answer.headers["x-turnout-backend"] == "llama"
    assert took < FAST["read"]  # the hang was recognised before the longest wait
    assert len(fault.calls) == 1


def test_a_silent_engine_that_reports_work_is_waited_for(hung: tuple[Stack, Fault]) -> None:
    """Reporting a request running (ours, queued or prefilling): silence is not a hang. Only the
    longest wait (``read``) ends it, with a clear error."""
    stack, fault = hung
    fault.hang, fault.running = True, 1
    until(lambda: faulty_backend(stack)["running"] == 1, "a probe saw the engine's load")
    started = time.monotonic()
    answer = httpx.post(
        stack.url + "/v1/chat/completions", json={"model": "m-hung-only", "messages": MSG}, timeout=30
    )
    took = time.monotonic() - started
    assert took >= FAST["read"]  # waited past first_byte (0.5 s), up to the longest wait
    assert answer.status_code in (502, 503)
    assert "no answer in 8 s" in answer.json()["error"]["message"]


def test_a_stream_that_stalls_ends_with_an_error_event(hung: tuple[Stack, Fault]) -> None:
    stack, fault = hung
    fault.stall_after = 2
    body = {"model": "m-hung-only", "messages": MSG, "stream": True}
    with httpx.stream("POST", stack.url + "/v1/chat/completions", json=body, timeout=30) as response:
        assert response.status_code == 200
        events = [e for e in response.read().split(b"\n\n") if e]
    assert [b'"content":"hi"' in e for e in events[:2]] == [True, True]
    error = json.loads(events[2].removeprefix(b"data: "))["error"]
    assert error["type"] == "upstream_error"
    assert "stalled" in error["message"]
    assert events[3] == b"data: [DONE]"
    assert last_decision(stack)["error"].startswith("no data for")


def test_a_request_queued_for_a_llama_slot_is_not_taken_for_a_hang() -> None:
    """One slot, busy with a long answer: the next request waits without headers (as llama-server
    does) longer than ``first_byte``, and is answered, because the engine reports it deferred."""
    llama = SimConfig(kind="llamacpp", model="up-llama", time_scale=0.2, slots=1)
    running = start_stack(llama=llama, timeouts={"first_byte": 0.3})
    try:
        before = len(running.events("llama"))
        slow = {"model": "m-llama", "messages": MSG, "max_tokens": 2000, "ignore_eos": True}  # ~4 s
        first = threading.Thread(
            target=lambda: httpx.post(running.url + "/v1/chat/completions", json=slow, timeout=120)
        )
        first.start()
        until(lambda: len(running.events("llama")) > before, "the long answer took the slot")
        second = httpx.post(
            running.url + "/v1/chat/completions", json={"model": "m-llama", "messages": MSG}, timeout=120
        )
        first.join(120)
        events = [(e.kind.value, e.completion_tokens) for e in running.events("llama")[before:]]
    finally:
        stop_stack(running)
    assert second.status_code == 200
    # the second started only when the first's 2000 tokens were done: it queued the whole time
    # (seconds, past the 0.3 s first-byte deadline and its check interval) and was not taken for a hang
    assert events == [("start", 0), ("finish", 2000), ("start", 0), ("finish", events[-1][1])]


COMPLETION = {
    "id": "c", "object": "chat.completion", "created": 0, "model": "up-faulty",
    "choices": [{"index": 0, "message": {"role": "assistant", "content": "ok"}, "finish_reason": "stop"}],
    "usage": {"prompt_tokens": 5, "completion_tokens": 1, "total_tokens": 6},
}  # fmt: skip


def test_a_backend_that_keeps_failing_is_taken_out_then_tried_once(hung: tuple[Stack, Fault]) -> None:
    stack, fault = hung
    fault.status, fault.body = 500, json.dumps({"error": {"message": "CUDA out of memory"}}).encode()
    ask = {"model": "m-hung", "messages": MSG}
    for _ in range(2):  # each fails on the faulty engine and is answered by llama.cpp
        answered = httpx.post(stack.url + "/v1/chat/completions", json=ask, timeout=30)
        assert answered.headers["x-turnout-backend"] == "llama"
    assert len(fault.calls) == 2
    answer = httpx.post(stack.url + "/v1/chat/completions", json=ask, timeout=30)
    assert answer.headers["x-turnout-backend"] == "llama"
    assert len(fault.calls) == 2  # open: not even tried
    assert "faulty: circuit-open" in answer.headers["x-turnout-route-reason"]
    rejected = last_decision(stack)["rejected"]
    assert rejected[0]["reason"] == "circuit-open"
    assert "CUDA out of memory" in rejected[0]["detail"]
    assert circuit(stack) == "open"
    assert faulty_backend(stack)["circuit"] == "open"  # the dashboard shows it
    metrics = httpx.get(stack.url + "/metrics", timeout=30).text
    assert 'turnout_backend_circuit{backend="faulty",state="open"} 1.0' in metrics
    assert 'turnout_backend_circuit_trips_total{backend="faulty"} 1.0' in metrics

    fault.status, fault.body = 200, json.dumps(COMPLETION).encode()  # the engine recovered
    until(lambda: circuit(stack) == "half-open", "the cool-down passed: half-open, one trial")
    trial = httpx.post(stack.url + "/v1/chat/completions", json=ask, timeout=30)
    assert (trial.status_code, trial.headers["x-turnout-backend"]) == (200, "faulty")
    assert circuit(stack) == "closed"
