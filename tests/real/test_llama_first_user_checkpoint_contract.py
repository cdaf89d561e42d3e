"""Contract: on a cold prompt llama-server checkpoints where the first user message starts (the slot
has no checkpoint, so its prompt loop ends a step at a user message: ``server-context.cpp``, "break at
the last user message, or at user messages at least min step past the last checkpoint"), and a later
chat sharing only the system prompt restores that much; the simulator does the same
(``policies.checkpoints.checkpoint_positions``' ``first_user``).

A multi-turn chat (system, user, assistant, user) on a fresh slot, then a new chat with the same system
prompt and another question, pinned to the same slot, ``--cache-ram 0`` so nothing else holds it: the
second reuses exactly the tokens before its first user message, as each engine counts them (the
simulator's tokenizer is not the model's). Without that checkpoint the slot's others (the last user
message's start, 516 and 4 before the end) all lie past where the two chats part, and it reuses none.
"""

from __future__ import annotations

from typing import Any

import httpx
import pytest

from backends.sim import create_sim_app, tokenizer
from backends.sim.chat import render_chat
from tests.real.llama_server import CLIENT_LIMITS, DEFAULT_ALIAS, LlamaServerFactory, twin_sim_config
from tests.servers import serve

pytestmark = [pytest.mark.real_llama, pytest.mark.timeout(300)]

SLOT_CTX = 4096


def words(seed: int, n: int) -> str:
    return " ".join(f"w{(seed * 7919 + i * 31) % 997}" for i in range(n))


SYSTEM = {"role": "system", "content": words(1, 250)}
FIRST = [
    SYSTEM,
    {"role": "user", "content": words(2, 100)},
    {"role": "assistant", "content": words(3, 60)},
    {"role": "user", "content": words(4, 100)},
]
SECOND = [SYSTEM, {"role": "user", "content": words(5, 100)}]


def cache_n(client: httpx.Client, messages: list[dict[str, Any]]) -> int:
    body = {"model": DEFAULT_ALIAS, "messages": messages, "max_tokens": 1, "temperature": 0, "id_slot": 0}
    response = client.post("/v1/chat/completions", json=body)
    assert response.status_code == 200, response.text
    return int(response.json()["timings"]["cache_n"])


def real_user_start(client: httpx.Client, messages: list[dict[str, Any]], nth: int = 1) -> int:
    """Tokens before the ``nth`` user message in the real server's own rendering of ``messages``."""
    prompt = client.post("/apply-template", json={"messages": messages}).json()["prompt"]
    at = -1
    for _ in range(nth):
        at = prompt.index("<|im_start|>user", at + 1)
    return len(client.post("/tokenize", json={"content": prompt[:at]}).json()["tokens"])


def sim_start(messages: list[dict[str, Any]], upto: int) -> int:
    """Tokens before message ``upto`` in the simulator's rendering (the parts add up: each starts with
    a special token)."""
    return len(tokenizer.encode(render_chat(messages[:upto], None, add_generation_prompt=False)))


def cold_then_shared(
    llama_server: LlamaServerFactory, first: list[dict[str, Any]], second: list[dict[str, Any]], nth: int
) -> None:
    """``first`` on a fresh slot of both engines, then ``second``, which shares ``first`` up to its
    ``nth`` user message: each reuses nothing, then exactly what comes before that message."""
    real = llama_server(n_parallel=1, ctx_total=SLOT_CTX, extra_args=["--cache-ram", "0"])
    config = twin_sim_config(SLOT_CTX, slots=1, time_scale=0.0, cache_ram_mib=0)
    upto = [i for i, m in enumerate(second) if m["role"] == "user"][nth - 1]
    with (
        serve(create_sim_app(config)) as sim,
        httpx.Client(base_url=real.base_url, timeout=120, limits=CLIENT_LIMITS) as real_client,
        httpx.Client(base_url=sim.url, timeout=30) as sim_client,
    ):
        expected = {"real": real_user_start(real_client, second, nth), "sim": sim_start(second, upto)}
        got = {
            name: [cache_n(client, first), cache_n(client, second)]
            for name, client in (("real", real_client), ("sim", sim_client))
        }
    assert min(expected.values()) > 200, expected  # the system prompt's tokens, or the first exchange's
    assert got == {name: [0, start] for name, start in expected.items()}, (got, expected)


def test_a_new_chat_restores_the_system_prompt_a_cold_multi_turn_chat_left(
    llama_server: LlamaServerFactory,
) -> None:
    cold_then_shared(llama_server, FIRST, SECOND, nth=1)


def test_a_chat_that_starts_with_its_user_message_checkpoints_the_next_one(
    llama_server: LlamaServerFactory,
) -> None:
    """Without a system prompt the first user message starts the prompt, where the server never looks
    (it checks for a user message's start after each token it adds): the next user message is the first
    it breaks at, on the CPU build a cold 5-message chat took its checkpoint there (631 tokens in), and
    a chat that shares the first exchange restores it."""
    first = [
        {"role": "user", "content": words(6, 150)},
        {"role": "assistant", "content": words(7, 60)},
        {"role": "user", "content": words(8, 100)},
        {"role": "assistant", "content": words(9, 40)},
        {"role": "user", "content": words(10, 60)},
    ]
    cold_then_shared(llama_server, first, [*first[:2], {"role": "user", "content": words(11, 100)}], nth=2)
