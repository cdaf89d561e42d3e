"""Deterministic outputs: the natural answer, and ``ignore_eos`` running on to ``max_tokens``."""

from __future__ import annotations

import pytest

from tests.backends.sim.simhelp import running, user


@pytest.mark.parametrize("kind", ["vllm", "llamacpp"])
def test_ignore_eos_generates_max_tokens(kind: str) -> None:
    body = {"model": "sim-model", "messages": [user("hi")], "max_tokens": 300}
    with running(kind) as (client, _):
        natural = client.post("/v1/chat/completions", json=body).json()
        forced = client.post("/v1/chat/completions", json={**body, "ignore_eos": True}).json()
        again = client.post("/v1/chat/completions", json=body).json()
    assert natural["usage"]["completion_tokens"] < 300
    assert natural["choices"][0]["finish_reason"] == "stop"
    assert forced["usage"]["completion_tokens"] == 300
    assert forced["choices"][0]["finish_reason"] == "length"
    assert again["choices"][0]["message"]["content"] == natural["choices"][0]["message"]["content"]
