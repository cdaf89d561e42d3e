"""The TTFT turnout reports is a first token, for streamed and non-streamed requests alike.

A non-streamed answer arrives whole: its first byte comes with its last token. Its first token is
taken from the engine's own timings where the engine reports them (llama.cpp: the answer's end less
``timings.predicted_ms``), else the request is left out of every TTFT figure (the log line, the
metrics, the decision log that the Predictions page, ``bought`` and the timeline read). The engines
here run in real time (``time_scale`` 1), so their reported timings are the wall's.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import httpx
import pytest

from backends.sim import SimConfig
from policies import Architecture
from tests.e2e.conftest import Stack, start_stack, stop_stack
from tests.e2e.test_metrics import scrape, total
from tests.servers import ADMIN

ANSWER_TOKENS = 40
DECODE_TOK_S = 40.0  # an answer takes ~1 s after its first token


@pytest.fixture(scope="module")
def stack() -> Iterator[Stack]:
    running = start_stack(
        vllm=SimConfig(
            kind="vllm", model="up-vllm", architecture=Architecture.HYBRID, decode_tok_s=DECODE_TOK_S
        ),
        llama=SimConfig(kind="llamacpp", model="up-llama", slots=2, decode_tok_s=DECODE_TOK_S),
    )
    try:
        yield running
    finally:
        stop_stack(running)


def ask(client: httpx.Client, model: str, stream: bool, content: str) -> str:
    body: dict[str, Any] = {
        "model": model,
        "messages": [{"role": "user", "content": content}],
        "max_tokens": ANSWER_TOKENS,
        "ignore_eos": True,
        "stream": stream,
    }
    if stream:
        with client.stream("POST", "/v1/chat/completions", json=body) as response:
            response.read()
    else:
        response = client.post("/v1/chat/completions", json=body)
    assert response.status_code == 200, response.text
    return response.headers["x-request-id"]


def outcomes(client: httpx.Client, ids: list[str]) -> dict[str, dict[str, Any]]:
    entries = client.get("/admin/api/decisions", params={"limit": 100}, headers=ADMIN).json()["data"]
    return {e["request_id"]: e["outcome"] for e in entries if e["request_id"] in ids}


def test_a_non_streamed_answer_has_the_engine_reported_first_token(stack: Stack) -> None:
    with stack.client() as client:
        ids = [
            ask(client, "m-llama", stream, f"Same question, asked {n}.")
            for n, stream in enumerate([True, False])
        ]
        found = outcomes(client, ids)
    streamed, whole = found[ids[0]], found[ids[1]]
    assert streamed["ttft_s"] is not None
    assert whole["ttft_s"] is not None
    decode_s = (ANSWER_TOKENS - 1) / DECODE_TOK_S
    assert whole["duration_s"] > decode_s  # the answer's duration is mostly its decode...
    assert whole["ttft_s"] < whole["duration_s"] - 0.8 * decode_s  # ...which its TTFT is not
    assert abs(whole["ttft_s"] - streamed["ttft_s"]) < 0.5 * decode_s  # the same prompt's first token


def test_a_non_streamed_answer_without_engine_timings_has_no_ttft(stack: Stack) -> None:
    """vLLM reports no timings: the request counts nowhere TTFT is shown, never as its duration."""
    before = scrape(stack)
    with stack.client() as client:
        ids = [ask(client, "m-vllm", stream, f"Question {n}.") for n, stream in enumerate([False, True])]
        found = outcomes(client, ids)
    after = scrape(stack)
    assert found[ids[0]]["ttft_s"] is None
    assert found[ids[1]]["ttft_s"] is not None
    counted = total(after["turnout_ttft_seconds_count"], backend="vllm") - total(
        before.get("turnout_ttft_seconds_count", {}), backend="vllm"
    )
    assert counted == 1  # the streamed one only
