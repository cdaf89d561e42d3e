"""SIGTERM drains the gateway: new requests get 503, streams in flight finish within the grace
period or end with an error event, and the process exits 0 (``gateway.serving.GracefulServer``)."""

from __future__ import annotations

import json
import signal
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from backends.sim import SimConfig, create_sim_app
from tests.e2e.processes import GatewayProcess
from tests.servers import ServerThread

GRACE_S = 10.0  # ample for a ~1 s stream to finish on a busy machine
SHORT_GRACE_S = 2.0  # for the stream that cannot finish (~36 s of tokens)
LONG = {"model": "m", "messages": [{"role": "user", "content": "go"}], "stream": True, "ignore_eos": True}


@pytest.fixture(scope="module")
def engine() -> Iterator[ServerThread]:
    """A llama.cpp simulator decoding ~550 tokens a second (time scale 0.2)."""
    sim = ServerThread(
        create_sim_app(SimConfig(kind="llamacpp", model="up", time_scale=0.2, slots=4))
    ).start()
    try:
        yield sim
    finally:
        sim.stop()


@pytest.fixture
def gateway(engine: ServerThread, tmp_path: Path, request: pytest.FixtureRequest) -> Iterator[GatewayProcess]:
    grace = getattr(request, "param", GRACE_S)
    running = GatewayProcess(engine.url, tmp_path, {"shutdown_grace_s": grace})
    try:
        yield running
    finally:
        if running.process.poll() is None:
            running.process.kill()
            running.process.wait()


def draining(url: str, timeout: float = 30.0) -> None:
    """Until the gateway has taken the SIGTERM: /health says it drains."""
    deadline = time.monotonic() + timeout
    while httpx.get(url + "/health", timeout=10).json()["status"] != "draining":
        assert time.monotonic() < deadline, "the gateway never started draining"
        time.sleep(0.05)


def test_sigterm_lets_a_stream_finish_refuses_new_requests_and_exits_0(gateway: GatewayProcess) -> None:
    out: dict[str, Any] = {}
    reader = gateway.stream(500, out)  # ~1 s: within the grace period
    gateway.process.send_signal(signal.SIGTERM)
    draining(gateway.url)
    refused = httpx.post(gateway.url + "/v1/chat/completions", json={**LONG, "stream": False}, timeout=10)
    assert refused.status_code == 503
    assert refused.json()["error"]["code"] == "shutting_down"
    assert refused.headers["retry-after"] == "1"
    health = httpx.get(gateway.url + "/health", timeout=10)
    assert (health.status_code, health.json()["status"]) == (503, "draining")
    reader.join(30)
    assert out["events"][-1] == "data: [DONE]"
    assert not any('"error"' in e for e in out["events"])  # it finished as it would have
    assert gateway.process.wait(30) == 0


@pytest.mark.parametrize("gateway", [SHORT_GRACE_S], indirect=True)
def test_a_stream_longer_than_the_grace_period_ends_with_an_error_event(gateway: GatewayProcess) -> None:
    out: dict[str, Any] = {}
    reader = gateway.stream(20_000, out)  # ~36 s: far longer than the grace period
    signalled = time.monotonic()
    gateway.process.send_signal(signal.SIGTERM)
    reader.join(60)
    ended = time.monotonic() - signalled
    error = json.loads(out["events"][-2][5:])["error"]
    assert error["code"] == "shutting_down"
    assert out["events"][-1] == "data: [DONE]"
    assert SHORT_GRACE_S <= ended < 20  # ended by the grace period, long before the answer would have
    assert gateway.process.wait(30) == 0
