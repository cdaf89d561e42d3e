"""Contract: llama-server places its first near-end context checkpoint ``min(batch, 4 + ubatch)``
tokens before a prompt's end, and the simulator (``PrefillModel.checkpoint_gap``) does the same.

A replayed trace turn (or any prompt that rewrites the last few tokens of the previous one: a chat
template closing where the next turn's text goes on) diverges between that checkpoint and the one 4
tokens before the end, so the slot restores the first: at the default ``--ubatch-size 512`` it keeps
all but 516 tokens, at compose's ``--ubatch-size 2048 --batch-size 2048`` all but 2,048. The real
server and its twin simulator, configured with the same micro-batch, must report the same
``cache_n`` for every turn.
"""

from __future__ import annotations

from collections.abc import Iterator

import httpx
import pytest

from backends.sim import create_sim_app
from tests.real.llama_server import CLIENT_LIMITS, DEFAULT_ALIAS, LlamaServerFactory, twin_sim_config
from tests.servers import serve

pytestmark = [pytest.mark.real_llama, pytest.mark.timeout(300)]

SLOT_CTX = 8192
FIRST = list(range(1000, 4000))  # 3,000 ordinary token ids of the qwen2 vocabulary
TAIL = 8  # the next turn rewrites the first turn's last 8 tokens (past the checkpoint 4 before its end)
SECOND = FIRST[:-TAIL] + list(range(5000, 5400))
THIRD = SECOND + list(range(6000, 6100))  # extends the second: the live state, whatever the gap


def cache_n(client: httpx.Client, prompt: list[int]) -> int:
    body = {"model": DEFAULT_ALIAS, "prompt": prompt, "max_tokens": 1, "temperature": 0, "id_slot": 0}
    response = client.post("/v1/completions", json=body)
    assert response.status_code == 200, response.text
    return int(response.json()["timings"]["cache_n"])


@pytest.fixture(params=[(512, 2048), (2048, 2048)], ids=["ubatch-512", "ubatch-2048"])
def engines(
    request: pytest.FixtureRequest, llama_server: LlamaServerFactory
) -> Iterator[tuple[int, str, str]]:
    ubatch, batch = request.param
    flags = ["--ubatch-size", str(ubatch), "--batch-size", str(batch), "--cache-ram", "0"]
    real = llama_server(n_parallel=1, ctx_total=SLOT_CTX, extra_args=flags)
    config = twin_sim_config(SLOT_CTX, slots=1, ubatch=ubatch, batch=batch, time_scale=0.0, cache_ram_mib=0)
    with serve(create_sim_app(config)) as sim:
        yield min(batch, 4 + ubatch), real.base_url, sim.url


def test_a_turn_that_rewrites_the_tail_restores_the_checkpoint_the_gap_before(
    engines: tuple[int, str, str],
) -> None:
    gap, real_url, sim_url = engines
    with (
        httpx.Client(base_url=real_url, timeout=120, limits=CLIENT_LIMITS) as real,
        httpx.Client(base_url=sim_url, timeout=30) as sim,
    ):
        got = {
            name: [cache_n(client, p) for p in (FIRST, SECOND, THIRD)]
            for name, client in (("real", real), ("sim", sim))
        }
    # the answer's one token is not kept past the prompt (the slot holds the prompt and the sampled token,
    # less the last): the third turn extends the second whole, less the slot's last token
    assert got["real"][:2] == [0, len(FIRST) - gap], got
    assert got["sim"] == got["real"], got
