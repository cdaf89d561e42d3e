"""`turnout epp` as a process: it serves its health services once the engines were probed, and on
SIGTERM stops taking requests (readiness goes down) and exits cleanly within its grace."""

from __future__ import annotations

import signal
import subprocess
import sys
import time
from pathlib import Path

import grpc
import pytest
from grpc_health.v1 import health_pb2, health_pb2_grpc

from backends.sim import SimConfig, create_sim_app
from tests.real.llama_server import free_port
from tests.servers import ServerThread

CONFIG = """
[[backends]]
id = "vllm"
kind = "vllm"
url = "{url}"

[[models]]
name = "m"
[[models.deployments]]
backend = "vllm"
upstream_name = "up"
"""


def test_turnout_epp_serves_then_drains_on_sigterm(tmp_path: Path) -> None:
    engine = ServerThread(create_sim_app(SimConfig(kind="vllm", model="up", time_scale=0.002))).start()
    config = tmp_path / "turnout.toml"
    config.write_text(CONFIG.format(url=engine.url))
    port = free_port()
    process = subprocess.Popen(
        [sys.executable, "-m", "gateway", "epp", "--config", str(config), "--listen", f"127.0.0.1:{port}",
         "--grace", "2"],
        stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
    )  # fmt: skip
    try:
        channel = grpc.insecure_channel(f"127.0.0.1:{port}")
        grpc.channel_ready_future(channel).result(timeout=60)
        stub = health_pb2_grpc.HealthStub(channel)
        deadline = time.monotonic() + 30
        status = None
        while time.monotonic() < deadline and status != health_pb2.HealthCheckResponse.SERVING:
            status = stub.Check(health_pb2.HealthCheckRequest(service="readiness"), timeout=5).status
        assert status == health_pb2.HealthCheckResponse.SERVING
        process.send_signal(signal.SIGTERM)
        assert process.wait(timeout=30) == 0
        output = process.stdout.read().decode() if process.stdout else ""
        assert "epp.serving" in output
        assert "epp.draining" in output
    finally:
        if process.poll() is None:
            process.kill()
            process.wait(timeout=10)
        engine.stop()


def test_turnout_epp_refuses_a_fallback_count_out_of_range(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    from gateway.cli import main

    config = tmp_path / "turnout.toml"
    config.write_text(CONFIG.format(url="http://127.0.0.1:1"))
    for count in ("-1", "9"):
        assert main(["epp", "--config", str(config), "--fallbacks", count]) == 2
        assert f"--fallbacks must be 0 to 8, not {count}" in capsys.readouterr().err
