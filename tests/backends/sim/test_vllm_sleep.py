"""The vLLM simulator's sleep mode: the endpoints, the measured seconds (times ``time_scale``: each step
takes at least its share), the prefix cache lost on any sleep, and no generation while asleep."""

from __future__ import annotations

import time

import httpx
import pytest

from backends.sim.sleep_state import SleepTimes
from tests.backends.sim.simhelp import running

SCALE = 0.01
PROMPT = list(range(3, 3000))


def complete(client: httpx.Client) -> httpx.Response:
    return client.post("/v1/completions", json={"prompt": PROMPT, "max_tokens": 2})


def timed(client: httpx.Client, path: str, **kwargs: object) -> float:
    started = time.monotonic()
    response = client.post(path, **kwargs)  # type: ignore[arg-type]
    assert response.status_code == 200, response.text
    return time.monotonic() - started


def asleep(client: httpx.Client) -> bool:
    return bool(client.get("/is_sleeping").json()["is_sleeping"])


def test_level_1_parks_the_weights_loses_the_cache_and_refuses_requests_until_woken() -> None:
    times = SleepTimes()
    with running("vllm", time_scale=SCALE, enable_sleep_mode=True, block_size=784) as (client, _):
        assert complete(client).status_code == 200
        warm = complete(client).json()["usage"]
        assert warm["prompt_tokens_details"]["cached_tokens"] == 2352  # three whole 784-token blocks
        assert not asleep(client)
        first = timed(client, "/sleep", params={"level": 1})
        assert first >= times.level1_first_s * SCALE  # the first sleep allocates the host buffers
        assert asleep(client)
        refused = complete(client)
        assert refused.status_code == 503
        assert "wake it" in refused.json()["error"]["message"]
        assert timed(client, "/wake_up") >= times.wake1_s * SCALE
        assert not asleep(client)
        cold = complete(client).json()["usage"]
        assert cold["prompt_tokens_details"]["cached_tokens"] == 0  # any sleep empties the prefix cache
        assert timed(client, "/sleep", params={"level": 1}) >= times.level1_s * SCALE


def test_level_2_needs_the_weights_woken_reloaded_and_the_kv_cache_woken() -> None:
    times = SleepTimes()
    with running("vllm", time_scale=SCALE, enable_sleep_mode=True) as (client, _):
        assert timed(client, "/sleep", params={"level": 2}) >= times.level2_s * SCALE
        assert timed(client, "/wake_up", params={"tags": "weights"}) >= times.wake_weights_s * SCALE
        assert asleep(client)  # the KV cache is still asleep
        assert timed(client, "/wake_up", params={"tags": "kv_cache"}) >= times.wake_kv_s * SCALE
        assert not asleep(client)
        garbage = complete(client)
        assert garbage.status_code == 503
        assert "reload" in garbage.json()["error"]["message"]
        reload = timed(client, "/collective_rpc", json={"method": "reload_weights"})
        assert reload >= times.reload_weights_s * SCALE
        assert complete(client).status_code == 200


def test_without_sleep_mode_the_endpoints_are_not_there() -> None:
    with running("vllm") as (client, _):
        assert client.post("/sleep", params={"level": 1}).status_code == 404
        assert client.get("/is_sleeping").status_code == 404


@pytest.mark.parametrize("body", [b'{"method": "nope"}', b"{"])
def test_an_unknown_rpc_is_refused(body: bytes) -> None:
    with running("vllm", enable_sleep_mode=True) as (client, _):
        assert client.post("/collective_rpc", content=body).status_code == 400
