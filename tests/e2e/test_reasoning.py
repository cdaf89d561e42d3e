"""Reasoning streams through turnout: every delta arrives, complete, in order and unmerged.

The simulators play thinking models here (``reasoning_tokens``): llama.cpp streams the reasoning as
``delta.reasoning_content``, vLLM 0.32 as ``delta.reasoning``.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from typing import Any

import anthropic
import pytest

from backends.sim import SimConfig
from tests.e2e.conftest import Stack, start_stack, stop_stack

REASONING_TOKENS = 24
ASK = [{"role": "user", "content": "Think first, then answer."}]
FIELD = {"vllm": "reasoning", "llama": "reasoning_content"}


@pytest.fixture(scope="module")
def thinking() -> Iterator[Stack]:
    running = start_stack(
        vllm=SimConfig(kind="vllm", model="up-vllm", time_scale=0.002, reasoning_tokens=REASONING_TOKENS),
        llama=SimConfig(
            kind="llamacpp", model="up-llama", time_scale=0.002, reasoning_tokens=REASONING_TOKENS
        ),
    )
    try:
        yield running
    finally:
        stop_stack(running)


def deltas(raw: bytes, field: str) -> list[str]:
    out = []
    for event in raw.split(b"\n\n"):
        if event.startswith(b"data: {"):
            for choice in json.loads(event[6:]).get("choices", []):
                if field in choice.get("delta", {}):
                    out.append(choice["delta"][field])
    return out


@pytest.mark.parametrize("include_usage", [False, True])
@pytest.mark.parametrize(("model", "backend"), [("m-vllm", "vllm"), ("m-llama", "llama")])
def test_reasoning_deltas_arrive_whole_and_unmerged(
    thinking: Stack, model: str, backend: str, include_usage: bool
) -> None:
    body: dict[str, Any] = {"model": model, "messages": ASK, "max_tokens": 40, "stream": True}
    if include_usage:
        body["stream_options"] = {"include_usage": True}
    with thinking.client() as client, client.stream("POST", "/v1/chat/completions", json=body) as response:
        received = response.read()
    _, sent = thinking.taps[backend].bodies[-1]
    field = FIELD[backend]
    assert deltas(received, field) == deltas(sent, field)  # same pieces, same order, none merged
    assert len(deltas(received, field)) == REASONING_TOKENS
    with thinking.client() as client:
        plain = {k: v for k, v in body.items() if k not in ("stream", "stream_options")}
        whole = client.post("/v1/chat/completions", json=plain).json()
    assert "".join(deltas(received, field)) == whole["choices"][0]["message"][field]


def test_reasoning_becomes_a_thinking_block_for_anthropic_clients_on_llama(thinking: Stack) -> None:
    """Pinned Anthropic requests go to llama-server as chat; the reasoning comes back as thinking."""
    claude = anthropic.Anthropic(base_url=thinking.url, api_key="unused", max_retries=0)
    with claude.messages.stream(
        model="m-llama", max_tokens=40, messages=ASK, extra_headers={"x-session-id": "thinker"}
    ) as stream:  # type: ignore[arg-type]
        pieces = [event.thinking for event in stream if event.type == "thinking"]
        final = stream.get_final_message()
    assert len(pieces) == REASONING_TOKENS
    assert final.content[0].type == "thinking"
    assert final.content[0].thinking == "".join(pieces)
