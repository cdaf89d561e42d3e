"""A background warm-up on a real llama-server (``gateway.warming``): a session's first turn answered
by the vLLM simulator while turnout prefills the same prompt, capped at one token, into a slot of
the real engine; the session's next turn there reuses it, by the engine's own count (``cache_n``).

The server has 2 slots of 2048 tokens; this hybrid (qwen35) model reuses a slot from a context
checkpoint taken a few tokens before the end of the prompt it processed, or from its live state.
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from typing import Any

import httpx
import pytest

from backends.sim import SimConfig, create_sim_app
from gateway.app import create_app
from gateway.settings import load_settings
from policies import Architecture
from tests.real.llama_server import DEFAULT_ALIAS, LlamaServer, LlamaServerFactory
from tests.servers import ServerThread

pytestmark = [pytest.mark.real_llama, pytest.mark.timeout(300)]

MODEL = "tiny"
SYSTEM = " ".join(f"Rule {i}: keep the build green and the tests honest." for i in range(60))


@pytest.fixture(scope="module")
def stack(llama_server_module: LlamaServerFactory) -> Iterator[tuple[LlamaServer, ServerThread]]:
    server = llama_server_module(n_parallel=2, ctx_total=4096)
    vllm = ServerThread(
        create_sim_app(
            SimConfig(kind="vllm", model="up-vllm", time_scale=0.002, architecture=Architecture.HYBRID)
        )
    ).start()
    engine = {"probe_interval_s": 0.2, "timeouts": {"probe": 10.0}}
    settings = load_settings(
        None,
        backends=[
            {"id": "vllm", "kind": "vllm", "url": vllm.url, **engine},
            {"id": "llama", "kind": "llamacpp", "url": server.base_url, **engine},
        ],
        models=[
            {
                "name": MODEL,
                "architecture": "hybrid",
                "deployments": [
                    {"backend": "vllm", "upstream_name": "up-vllm", "context_window": 8192},
                    {"backend": "llama", "upstream_name": DEFAULT_ALIAS},
                ],
            }
        ],
    )
    gateway = ServerThread(create_app(settings)).start()
    try:
        yield server, gateway
    finally:
        gateway.stop()
        vllm.stop()


def chat(gateway: ServerThread, messages: list[dict[str, Any]], max_tokens: int) -> httpx.Response:
    body = {"model": MODEL, "messages": messages, "max_tokens": max_tokens}
    response = httpx.post(
        gateway.url + "/v1/chat/completions", json=body, headers={"x-session-id": "warm"}, timeout=120
    )
    assert response.status_code == 200, response.text
    return response


def idle(server: LlamaServer, within_s: float = 60.0) -> list[dict[str, Any]]:
    """The server's slots once none is processing (the warm-up is done)."""
    deadline = time.monotonic() + within_s
    while True:
        slots: list[dict[str, Any]] = httpx.get(server.base_url + "/slots", timeout=10).json()
        if not any(s["is_processing"] for s in slots) or time.monotonic() > deadline:
            return slots
        time.sleep(0.1)


def test_a_warm_up_leaves_the_prompt_in_the_slot_for_the_next_turn(
    stack: tuple[LlamaServer, ServerThread],
) -> None:
    server, gateway = stack
    messages: list[dict[str, Any]] = [
        {"role": "system", "content": SYSTEM},
        {"role": "user", "content": "Start with the parser."},
    ]
    first = chat(gateway, messages, max_tokens=200)  # long enough an answer for the warm-up to be ready
    assert first.headers["x-turnout-backend"] == "vllm"
    reason = first.headers["x-turnout-route-reason"]
    assert "warms llama slot" in reason, reason
    slot = int(reason.split("warms llama slot ")[1].split()[0])
    slots = idle(server)
    assert not any(s["is_processing"] for s in slots)
    messages += [
        {"role": "assistant", "content": first.json()["choices"][0]["message"]["content"] or ""},
        {"role": "user", "content": "Now the tests."},
    ]
    second = chat(gateway, messages, max_tokens=8)
    assert (second.headers["x-turnout-backend"], second.headers["x-turnout-slot"]) == ("llama", str(slot))
    usage = second.json()["usage"]
    cache_n = second.json()["timings"]["cache_n"]
    assert usage["prompt_tokens_details"]["cached_tokens"] == cache_n
    # all but the answer and the new message: the warm-up's prompt, reused by the engine
    assert cache_n > 0.8 * usage["prompt_tokens"], (cache_n, usage)
