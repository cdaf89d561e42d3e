"""``POST /_sim/whatif`` predicts the cached tokens the simulator then really reuses, without side effects."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import httpx
import pytest

from backends.sim import SimConfig, create_sim_app
from backends.sim.vllm_engine import VllmEngine
from backends.sim.whatif import whatif_vllm
from gateway.replay.results import request_body
from gateway.replay.traces import TraceRequest
from policies import Architecture
from tests.servers import ServerThread


def turn(tokens: int, ids: tuple[int, ...]) -> dict[str, Any]:
    body = request_body(TraceRequest(0.0, "s", "m", tokens, ids, 4))
    body["stream"] = False
    del body["stream_options"]
    return body


TURNS = [turn(1500, (0, 1, 2)), turn(2600, (0, 1, 2, 3, 4, 5)), turn(2000, (0, 1, 7, 8))]


@pytest.fixture(params=["llamacpp", "vllm"])
def sim(request: pytest.FixtureRequest) -> Iterator[ServerThread]:
    config = SimConfig(
        kind=request.param,
        model="m",
        time_scale=0.001,
        architecture=Architecture.HYBRID,
        block_size=256,
        prefix_caching=True,
        slots=2,
    )
    server = ServerThread(create_sim_app(config)).start()
    try:
        yield server
    finally:
        server.stop()


def cached_of(response: httpx.Response) -> int:
    data = response.json()
    if "timings" in data:
        return int(data["timings"]["cache_n"])
    return int(data["usage"]["prompt_tokens_details"]["cached_tokens"])


class TestWhatIf:
    def test_prediction_matches_what_the_simulator_then_reports(self, sim: ServerThread) -> None:
        with httpx.Client(base_url=sim.url, timeout=30) as client:
            for body in TURNS:
                before = client.get("/_sim/events").json()
                first = client.post("/_sim/whatif", json=body).json()
                again = client.post("/_sim/whatif", json=body).json()
                assert first == again  # pure: asking does not change the state
                assert client.get("/_sim/events").json() == before
                if first["slot"] is not None:
                    body = {**body, "id_slot": first["slot"]}
                response = client.post("/v1/chat/completions", json=body)
                assert response.status_code == 200, response.text
                assert cached_of(response) == first["cached_tokens"]
                assert first["fits"]
                assert first["ttft_s"] >= first["prefill_s"] > 0

    def test_some_turn_hits_the_cache(self, sim: ServerThread) -> None:
        with httpx.Client(base_url=sim.url, timeout=30) as client:
            client.post("/v1/chat/completions", json=TURNS[0])
            assert client.post("/_sim/whatif", json=TURNS[1]).json()["cached_tokens"] > 900

    def test_llama_gives_every_slot_and_a_busy_slot_waits(self) -> None:
        config = SimConfig(kind="llamacpp", model="m", time_scale=0.001, slots=2)
        with httpx.Client(timeout=30) as client:
            server = ServerThread(create_sim_app(config)).start()
            try:
                answer = client.post(f"{server.url}/_sim/whatif", json=TURNS[0]).json()
                assert [o["slot"] for o in answer["options"]] == [0, 1]
                pinned = client.post(f"{server.url}/_sim/whatif", json={**TURNS[0], "id_slot": 1}).json()
                assert pinned["slot"] == 1
                assert "options" not in pinned
            finally:
                server.stop()

    def test_bad_body_is_400(self, sim: ServerThread) -> None:
        response = httpx.post(f"{sim.url}/_sim/whatif", json={"messages": "nope"}, timeout=10)
        assert response.status_code == 400


def test_vllm_fits_what_it_would_take() -> None:
    """vLLM takes a prompt shorter than its window and clamps a long answer (``vllm_errors``): the
    what-if says so, or the oracle refuses requests the engine serves."""
    engine = VllmEngine(SimConfig(kind="vllm", context_window=1000, prefix_caching=False))
    assert whatif_vllm(engine, list(range(990)), 500).fits  # 990 + 500 > 1000: clamped, not refused
    assert not whatif_vllm(engine, list(range(1000)), 1).fits
    assert not whatif_vllm(engine, list(range(10)), 1001).fits
