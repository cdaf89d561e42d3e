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


def real_user_start(client: httpx.Client, messages: list[dict[str, Any]]) -> int:
    """Tokens before the first user message in the real server's own rendering of ``messages``."""
    prompt = client.post("/apply-template", json={"messages": messages}).json()["prompt"]
    before = prompt[: prompt.index("<|im_start|>user")]
    return len(client.post("/tokenize", json={"content": before}).json()["tokens"])


def test_a_new_chat_restores_the_system_prompt_a_cold_multi_turn_chat_left(
    llama_server: LlamaServerFactory,
) -> None:
    real = llama_server(n_parallel=1, ctx_total=SLOT_CTX, extra_args=["--cache-ram", "0"])
    config = twin_sim_config(SLOT_CTX, slots=1, time_scale=0.0, cache_ram_mib=0)
    sim_start = len(tokenizer.encode(render_chat([SYSTEM], None, add_generation_prompt=False)))
    with (
        serve(create_sim_app(config)) as sim,
        httpx.Client(base_url=real.base_url, timeout=120, limits=CLIENT_LIMITS) as real_client,
        httpx.Client(base_url=sim.url, timeout=30) as sim_client,
    ):
        expected = {"real": real_user_start(real_client, SECOND), "sim": sim_start}
        got = {
            name: [cache_n(client, FIRST), cache_n(client, SECOND)]
            for name, client in (("real", real_client), ("sim", sim_client))
        }
    assert min(expected.values()) > 200, expected  # the system prompt's tokens
    assert got == {name: [0, start] for name, start in expected.items()}, (got, expected)
