"""Faults against real processes: engines killed, restarted, hung; nothing hangs, nothing leaks."""

from __future__ import annotations

import json
import threading
import time
from collections.abc import Iterator
from typing import Any

import httpx
import pytest

from tests.e2e.processes import ProcessStack, start_process_stack
from tests.servers import ADMIN

SYSTEM = {"role": "system", "content": "You are a careful coding agent. " * 100}
NO_TIMER_S = 10.0
"""Ended "at once": by the engine's connection closing, well before any timer could have ended it (the
first-byte deadline is 30 s, a stream's idle deadline 60 s), however busy the machine is."""


@pytest.fixture
def stack() -> Iterator[ProcessStack]:
    running = start_process_stack(time_scale=0.2)  # 2,000 tokens take ~4 s: time to kill mid-answer
    try:
        yield running
    finally:
        running.stop()


def ask(url: str, *, stream: bool, max_tokens: int = 8, session: str = "victim") -> dict[str, Any]:
    return {
        "url": url + "/v1/chat/completions",
        "json": {"model": "m-both", "messages": [SYSTEM, {"role": "user", "content": "go"}],
                 "max_tokens": max_tokens, "stream": stream, "ignore_eos": True},  # all max_tokens of it
        "headers": {"x-session-id": session},
        "timeout": 30,
    }  # fmt: skip


def overview(url: str) -> dict[str, Any]:
    backends = httpx.get(url + "/admin/api/overview", headers=ADMIN, timeout=30).json()["backends"]
    return {b["id"]: b for b in backends}


def warm_on_llama(stack: ProcessStack) -> None:
    """Two short turns: the session is pinned to a llama.cpp slot."""
    for _ in range(2):
        answer = httpx.post(**ask(stack.url, stream=False))
        assert answer.status_code == 200
    assert answer.headers["x-turnout-backend"] == "llama"


def test_an_engine_killed_mid_stream_ends_the_stream_with_an_error_event_at_once(stack: ProcessStack) -> None:
    warm_on_llama(stack)
    events: list[str] = []
    with httpx.stream("POST", **ask(stack.url, stream=True, max_tokens=2000)) as response:
        assert response.headers["x-turnout-backend"] == "llama"
        lines = response.iter_lines()
        for line in lines:
            if line.startswith("data:"):
                events.append(line)
            if len(events) == 3:
                break
        stack.sims["llama"].kill()
        killed = time.monotonic()
        events += [line for line in lines if line.startswith("data:")]
        ended = time.monotonic()
    assert ended - killed < NO_TIMER_S  # the error event and the end of the stream, at once
    assert events[-1] == "data: [DONE]"  # a clean end, after the error event
    error = json.loads(events[-2][5:])
    assert error["error"]["type"] == "upstream_error", error
    assert "llama" in error["error"]["message"]
    assert overview(stack.url)["llama"]["health"] == "down"  # marked at once, not at the next probe
    again = httpx.post(**ask(stack.url, stream=False))
    assert again.status_code == 200
    assert again.headers["x-turnout-backend"] == "vllm"  # the next request goes elsewhere
    llama = overview(stack.url)["llama"]
    assert llama["leases"] == []  # the session's lease went with the engine
    assert llama["in_flight"] == 0
    assert overview(stack.url)["vllm"]["in_flight"] == 0


def kill_while_answering(stack: ProcessStack, model: str) -> tuple[httpx.Response, float]:
    """A plain (non-streamed) request of 2,000 tokens; llama.cpp killed once a slot is generating it.
    Returns the response and how long after the kill it came."""
    result: dict[str, Any] = {}

    def send() -> None:
        request = ask(stack.url, stream=False, max_tokens=2000)
        request["json"]["model"] = model
        result["response"] = httpx.post(**request)
        result["ended"] = time.monotonic()

    sender = threading.Thread(target=send)
    sender.start()
    generating(stack.sims["llama"].url)  # 2,000 tokens take seconds at this time scale
    stack.sims["llama"].kill()
    killed = time.monotonic()
    sender.join(30)
    return result["response"], result["ended"] - killed


def generating(llama: str, timeout: float = 30.0) -> None:
    """Until one of the llama.cpp simulator's slots is processing a request."""
    deadline = time.monotonic() + timeout
    while not any(slot["is_processing"] for slot in httpx.get(llama + "/slots", timeout=30).json()):
        assert time.monotonic() < deadline, "no slot started the request"
        time.sleep(0.05)


def test_an_engine_killed_during_a_plain_request_is_a_502_at_once(stack: ProcessStack) -> None:
    """Only llama.cpp serves the model: a 502 in the API's shape at once."""
    warm_on_llama(stack)
    response, after = kill_while_answering(stack, "m-llama")
    assert response.status_code == 502
    assert response.json()["error"]["type"] == "upstream_error"
    assert after < NO_TIMER_S
    assert overview(stack.url)["llama"]["health"] == "down"
    assert overview(stack.url)["llama"]["in_flight"] == 0


def test_a_plain_request_whose_engine_died_is_answered_by_another(stack: ProcessStack) -> None:
    """Nothing had reached the client (an engine sends a plain answer's headers with its body): the
    request goes to another backend serving the model, as a failure before the first byte does."""
    warm_on_llama(stack)
    response, _ = kill_while_answering(stack, "m-both")
    assert response.status_code == 200
    assert response.headers["x-turnout-backend"] == "vllm"
    assert response.json()["usage"]["completion_tokens"] == 2000


def test_a_restarted_engine_is_known_to_hold_nothing(stack: ProcessStack) -> None:
    """Its slots are empty after a restart: turnout forgets the leases and what the prefix index said
    the engine held, and the session's next turn is placed afresh (no warm slot predicted)."""
    warm_on_llama(stack)
    warm = httpx.post(**ask(stack.url, stream=False))
    assert "warm slot" in warm.headers["x-turnout-route-reason"]
    (victim,) = [lease["session"] for lease in overview(stack.url)["llama"]["leases"]]
    stack.sims["llama"].kill()
    stack.sims["llama"].start()  # the same port, nothing in its slots

    def remembered() -> bool:
        llama = overview(stack.url)["llama"]
        return llama["health"] != "ready" or victim in [lease["session"] for lease in llama["leases"]]

    deadline = time.monotonic() + 30
    while remembered():
        assert time.monotonic() < deadline, overview(stack.url)["llama"]
        one_off = {"model": "m-both", "messages": [{"role": "user", "content": "ping"}], "max_tokens": 1}
        httpx.post(stack.url + "/v1/chat/completions", json=one_off, timeout=30)  # routing notices
        time.sleep(0.2)
    cold = httpx.post(**ask(stack.url, stream=False))
    assert "warm slot" not in cold.headers["x-turnout-route-reason"]
    decision = httpx.get(stack.url + "/admin/api/decisions?limit=1", headers=ADMIN).json()["data"][0]
    llama = next(c for c in decision["candidates"] if c["backend"] == "llama")
    assert llama["expected_cached_tokens"] == 0
