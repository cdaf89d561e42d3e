"""Contract: the simulator's RAM prompt cache reuses exactly what the real llama-server reuses.

Three conversations alternate over two slots, pinned and unpinned, on a real llama-server (tiny
random qwen35, ``-np 2``) and on the simulator configured alike, with the RAM cache on (the
default) and off (``--cache-ram 0``). Prompts are token ids, so both engines see the same tokens,
and every request generates one token, so a slot holds exactly its prompt afterwards. The
``timings.cache_n`` of every turn must be equal.
"""

from __future__ import annotations

from collections.abc import Iterator

import httpx
import pytest

from backends.sim import create_sim_app
from tests.real.llama_server import CLIENT_LIMITS, DEFAULT_ALIAS, LlamaServerFactory, twin_sim_config
from tests.servers import serve

pytestmark = [pytest.mark.real_llama, pytest.mark.timeout(300)]

SLOT_CTX = 2048


def conversation(first_id: int, length: int) -> list[int]:
    """Ordinary token ids of the qwen2 vocabulary, distinct per conversation."""
    return [first_id + i for i in range(length)]


A, B, C = conversation(1000, 300), conversation(3000, 260), conversation(5000, 220)
GROW_A, GROW_B, GROW_C = conversation(7000, 60), conversation(7100, 50), conversation(7200, 40)
EDITED_A = A[:-20] + conversation(7300, 20)  # an earlier part of A rewritten: a checkpoint or nothing

SCHEDULE: list[tuple[str, list[int], int]] = [
    ("A pinned to 0", A, 0),
    ("B pinned to 1", B, 1),
    ("C pinned to 0 (takes A's slot)", C, 0),
    ("A grows, pinned to 1 (takes B's slot, restores A)", A + GROW_A, 1),
    ("B grows, pinned to 0 (takes C's slot, restores B)", B + GROW_B, 0),
    ("C grows, unpinned (LRU slot)", C + GROW_C, -1),
    ("A grows again, unpinned", A + GROW_A + GROW_B, -1),
    ("A edited, pinned to 1", EDITED_A + GROW_C, 1),
    ("B grows again, pinned to 1", B + GROW_B + GROW_C, 1),
    ("C repeated whole, unpinned", C + GROW_C, -1),
]


def cache_n_per_turn(client: httpx.Client) -> list[int]:
    out = []
    for _, prompt, id_slot in SCHEDULE:
        body = {
            "model": DEFAULT_ALIAS,
            "prompt": prompt,
            "max_tokens": 1,
            "temperature": 0,
            "id_slot": id_slot,
            "cache_prompt": True,
        }
        response = client.post("/v1/completions", json=body)
        assert response.status_code == 200, response.text
        out.append(response.json()["timings"]["cache_n"])
    return out


@pytest.fixture(params=["on", "off"], ids=["cache-ram-default", "cache-ram-0"])
def engines(request: pytest.FixtureRequest, llama_server: LlamaServerFactory) -> Iterator[tuple[str, str]]:
    off = request.param == "off"
    real = llama_server(n_parallel=2, ctx_total=2 * SLOT_CTX, extra_args=["--cache-ram", "0"] if off else [])
    config = twin_sim_config(SLOT_CTX, time_scale=0.0, cache_ram_mib=0 if off else 8192)
    with serve(create_sim_app(config)) as sim:
        yield real.base_url, sim.url


def test_cache_n_per_turn_matches(engines: tuple[str, str], request: pytest.FixtureRequest) -> None:
    real_url, sim_url = engines
    with (
        httpx.Client(base_url=real_url, timeout=120, limits=CLIENT_LIMITS) as real,
        httpx.Client(base_url=sim_url, timeout=30) as sim,
    ):
        real_cached, sim_cached = cache_n_per_turn(real), cache_n_per_turn(sim)
    rows = [
        f"{name}: real {r}, sim {s}"
        for (name, _, _), r, s in zip(SCHEDULE, real_cached, sim_cached, strict=True)
    ]
    assert real_cached == sim_cached, "\n".join(rows)
    restores = [
        cached for (name, _, _), cached in zip(SCHEDULE, real_cached, strict=True) if "restores" in name
    ]
    assert all(restores) if "cache-ram-default" in request.node.name else not any(real_cached)
