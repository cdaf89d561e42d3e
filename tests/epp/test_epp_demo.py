"""docs/epp.md, "Against the demo", step by step (issue #60 item 11): the demo's running configuration
(its simulators' ports) is what ``turnout epp`` reads, Envoy runs deploy/envoy/envoy.yaml (its ports
moved to free ones), and a client's request through Envoy is answered by a simulated engine."""

from __future__ import annotations

import subprocess
import sys
import time
from pathlib import Path

import httpx
import pytest

from tests.demo_process import running_demo
from tests.epp.envoy import Envoy
from tests.real.llama_server import free_port

pytestmark = pytest.mark.timeout(180)


def test_the_picker_reads_the_demos_config_and_envoy_routes_to_its_engines(tmp_path: Path) -> None:
    with running_demo(tmp_path, TURNOUT_LOG_FORMAT="json") as demo:
        config = tmp_path / "demo" / "turnout.toml"
        assert str(config) in demo.banner
        port = free_port()
        command = ["epp", "--config", str(config), "--listen", f"127.0.0.1:{port}"]
        picker = subprocess.Popen(
            [sys.executable, "-m", "gateway", *command],
            stdout=subprocess.DEVNULL, stderr=(tmp_path / "picker.log").open("w"),
        )  # fmt: skip
        envoy = Envoy(tmp_path, port)
        try:
            envoy.start()
            envoy.picker_healthy(timeout=60)
            body = {
                "model": "qwen3.8-27b",
                "messages": [{"role": "user", "content": "Hello!"}],
                "max_tokens": 8,
            }
            deadline = time.monotonic() + 30
            while True:  # the picker routes once it has probed the engines
                answer = httpx.post(envoy.url + "/v1/chat/completions", json=body, timeout=30)
                if answer.status_code == 200 or time.monotonic() > deadline:
                    break
                time.sleep(0.5)
            assert answer.status_code == 200, (answer.text, (tmp_path / "picker.log").read_text()[-2000:])
            assert answer.headers["x-turnout-backend"] in {"vllm", "llama-27b"}
            assert answer.json()["choices"][0]["message"]["content"]
            health = httpx.get(envoy.url + "/health", timeout=30)
            assert health.status_code == 200
            assert health.json()["status"] == "ok"
        finally:
            if envoy.process is not None:
                envoy.process.terminate()
                envoy.process.wait(timeout=30)
            picker.terminate()
            picker.wait(timeout=30)
