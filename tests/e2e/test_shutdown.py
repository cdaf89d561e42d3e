"""SIGTERM drains the gateway: new requests get 503, streams in flight finish within the grace
period or end with an error event, and the process exits 0 (``gateway.serving.GracefulServer``)."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from backends.sim import SimConfig, create_sim_app
from tests.real.llama_server import free_port
from tests.servers import ServerThread

GRACE_S = 2.0
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


class Gateway:
    """``turnout serve`` as its own process, so that it can be sent SIGTERM."""

    def __init__(self, engine: ServerThread, directory: Path) -> None:
        self.port = free_port()
        config = directory / "turnout.toml"
        config.write_text(
            f'[limits]\nshutdown_grace_s = {GRACE_S}\n\n[[backends]]\nid = "llama"\nkind = "llamacpp"\n'
            f'url = "{engine.url}"\nprobe_interval_s = 0.2\n\n[[models]]\nname = "m"\n'
            '[[models.deployments]]\nbackend = "llama"\nupstream_name = "up"\n'
        )
        env = {**os.environ, "TURNOUT_PORT": str(self.port), "TURNOUT_LOG_FORMAT": "json"}
        self.process = subprocess.Popen(
            [sys.executable, "-m", "gateway", "serve", "--config", str(config)],
            env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
        )  # fmt: skip
        deadline = time.monotonic() + 30
        while True:
            try:
                if httpx.get(self.url + "/health", timeout=1).status_code == 200:
                    break
            except httpx.HTTPError:
                pass
            assert time.monotonic() < deadline, "turnout serve did not come up"
            time.sleep(0.1)

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def stream(self, max_tokens: int, out: dict[str, Any]) -> threading.Thread:
        """Stream in a thread: ``out["events"]`` gets the data lines (``out["started"]``: the first came)."""
        started = threading.Event()
        out["started"] = started

        def read() -> None:
            body = {**LONG, "max_tokens": max_tokens}
            with httpx.stream("POST", self.url + "/v1/chat/completions", json=body, timeout=60) as response:
                out["status"] = response.status_code
                out["events"] = []
                for line in response.iter_lines():
                    if line.startswith("data:"):
                        out["events"].append(line)
                        started.set()

        thread = threading.Thread(target=read)
        thread.start()
        assert started.wait(30)
        return thread


@pytest.fixture
def gateway(engine: ServerThread, tmp_path: Path) -> Iterator[Gateway]:
    running = Gateway(engine, tmp_path)
    try:
        yield running
    finally:
        if running.process.poll() is None:
            running.process.kill()
            running.process.wait()


def test_sigterm_lets_a_stream_finish_refuses_new_requests_and_exits_0(gateway: Gateway) -> None:
    out: dict[str, Any] = {}
    reader = gateway.stream(500, out)  # ~1 s: within the grace period
    gateway.process.send_signal(signal.SIGTERM)
    time.sleep(0.2)
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


def test_a_stream_longer_than_the_grace_period_ends_with_an_error_event(gateway: Gateway) -> None:
    out: dict[str, Any] = {}
    reader = gateway.stream(20_000, out)  # far longer than the grace period
    signalled = time.monotonic()
    gateway.process.send_signal(signal.SIGTERM)
    reader.join(30)
    ended = time.monotonic() - signalled
    error = json.loads(out["events"][-2][5:])["error"]
    assert error["code"] == "shutting_down"
    assert out["events"][-1] == "data: [DONE]"
    assert GRACE_S <= ended < GRACE_S + 5
    assert gateway.process.wait(30) == 0
