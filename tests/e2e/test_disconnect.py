"""A client that goes away cancels the engine's work: streaming, queued, or non-streamed.

The engines answer at (or slower than) real time, so each answer would run for tens of seconds:
a cancel that arrives with fewer tokens than asked for is the gateway's doing, however busy the
machine is; the waits for it are generous (they end as soon as it arrives)."""

from __future__ import annotations

import time
from collections.abc import Iterator
from typing import Any

import httpx
import pytest

from backends.sim import SimConfig
from tests.e2e.conftest import Stack, start_stack, stop_stack

MSG = [{"role": "user", "content": "Tell me a very long story."}]


@pytest.fixture(scope="module")
def slow() -> Iterator[Stack]:
    """Engines at real time: a 2000-token answer takes half a minute, so it is still running."""
    running = start_stack(
        vllm=SimConfig(kind="vllm", model="up-vllm", time_scale=1.0),
        llama=SimConfig(kind="llamacpp", model="up-llama", time_scale=1.0, slots=1),
    )
    try:
        yield running
    finally:
        stop_stack(running)


def wait_for_event(stack: Stack, backend: str, kind: str, since: int, timeout: float = 30.0) -> Any:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        for event in stack.events(backend)[since:]:
            if event.kind == kind:
                return event
        time.sleep(0.02)
    return None


@pytest.mark.parametrize(("model", "backend"), [("m-vllm", "vllm"), ("m-llama", "llama")])
def test_stream_disconnect_cancels_the_engines_work(slow: Stack, model: str, backend: str) -> None:
    before = len(slow.events(backend))
    body = {"model": model, "messages": MSG, "stream": True, "max_tokens": 2000, "ignore_eos": True}
    with (
        httpx.Client(base_url=slow.url, timeout=30) as client,
        client.stream("POST", "/v1/chat/completions", json=body) as response,
    ):
        assert response.status_code == 200
        chunks = response.iter_raw()
        next(chunks)
        next(chunks)
    cancel = wait_for_event(slow, backend, "cancel", before)
    assert cancel is not None, f"{backend} saw no cancel: {slow.events(backend)[before:]}"
    assert cancel.completion_tokens < 2000


def test_non_stream_disconnect_cancels(slow: Stack) -> None:
    before = len(slow.events("vllm"))
    body = {"model": "m-vllm", "messages": MSG, "max_tokens": 2000, "ignore_eos": True}
    with (
        httpx.Client(base_url=slow.url, timeout=httpx.Timeout(0.5)) as client,
        pytest.raises(httpx.ReadTimeout),
    ):
        client.post("/v1/chat/completions", json=body)
    cancel = wait_for_event(slow, "vllm", "cancel", before)
    assert cancel is not None
    assert cancel.completion_tokens < 2000


def test_queued_llama_request_is_cancelled_before_it_starts(slow: Stack) -> None:
    """llama-server sends no headers while a stream waits for a slot; leaving must still cancel it."""
    before = len(slow.events("llama"))
    busy = {"model": "m-llama", "messages": MSG, "stream": True, "max_tokens": 4000, "ignore_eos": True}
    queued = {"model": "m-llama", "messages": [{"role": "user", "content": "Queued."}], "stream": True}
    with (
        httpx.Client(base_url=slow.url, timeout=10) as client,
        client.stream("POST", "/v1/chat/completions", json=busy) as running,
    ):
        chunks = running.iter_raw()  # keep a reference: a dropped iterator closes the response
        next(chunks)
        with pytest.raises(httpx.ReadTimeout):
            client.post("/v1/chat/completions", json=queued, timeout=httpx.Timeout(0.5))
        cancel = wait_for_event(slow, "llama", "cancel", before)
    assert cancel is not None
    assert cancel.completion_tokens == 0


@pytest.fixture(scope="module")
def crawl() -> Iterator[Stack]:
    """Engines at a third of real speed: even a short natural answer still runs when the client leaves."""
    running = start_stack(
        vllm=SimConfig(kind="vllm", model="up-vllm", time_scale=3.0),
        llama=SimConfig(kind="llamacpp", model="up-llama", time_scale=3.0, slots=1),
    )
    try:
        yield running
    finally:
        stop_stack(running)


@pytest.mark.parametrize(("model", "backend"), [("m-vllm", "vllm"), ("m-llama", "llama")])
@pytest.mark.parametrize(
    ("path", "body"),
    [
        ("/v1/messages", {"max_tokens": 400, "messages": MSG}),
        ("/v1/responses", {"max_output_tokens": 400, "input": "Tell me a very long story."}),
    ],
)
def test_agent_api_disconnect_cancels(
    crawl: Stack, model: str, backend: str, path: str, body: dict[str, Any]
) -> None:
    before = len(crawl.events(backend))
    with (
        httpx.Client(base_url=crawl.url, timeout=30) as client,
        client.stream("POST", path, json={**body, "model": model, "stream": True}) as response,
    ):
        assert response.status_code == 200
        chunks = response.iter_raw()
        next(chunks)
    cancel = wait_for_event(crawl, backend, "cancel", before)
    assert cancel is not None, f"{backend} saw no cancel on {path}: {crawl.events(backend)[before:]}"
    assert cancel.completion_tokens < 400
