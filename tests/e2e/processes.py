"""Simulators as separate processes (``turnout sim``), so a test can kill one (SIGKILL) and start it
again on the same port, and a gateway in a thread routing to them; ``turnout serve`` as a process
(signals, server limits, its memory)."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx

from gateway.app import create_app
from tests.e2e.conftest import stack_settings
from tests.real.llama_server import free_port
from tests.servers import ServerThread


class SimProcess:
    """One ``turnout sim`` process on a fixed loopback port."""

    def __init__(self, kind: str, model: str, *args: str) -> None:
        self.kind = kind
        self.port = free_port()
        self.command = [
            sys.executable, "-m", "gateway", "sim", kind, "--host", "127.0.0.1", "--port",
            str(self.port), "--model", model, *args,
        ]  # fmt: skip
        self.process: subprocess.Popen[bytes] | None = None

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def start(self, timeout: float = 30.0) -> SimProcess:
        self.process = subprocess.Popen(self.command, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.process.poll() is not None:
                raise RuntimeError(f"{self.command} exited with {self.process.returncode}")
            try:
                if httpx.get(self.url + "/health", timeout=0.5).status_code == 200:
                    return self
            except httpx.HTTPError:
                pass
            time.sleep(0.05)
        raise RuntimeError(f"the {self.kind} simulator did not answer /health within {timeout} s")

    def kill(self) -> None:
        """SIGKILL: no goodbye, connections reset (an engine killed by the OOM killer)."""
        if self.process is not None and self.process.poll() is None:
            os.kill(self.process.pid, signal.SIGKILL)
            self.process.wait(timeout=10)

    def stop(self) -> None:
        if self.process is not None and self.process.poll() is None:
            self.process.terminate()
            try:
                self.process.wait(timeout=10)
            except subprocess.TimeoutExpired:
                self.kill()


@dataclass
class ProcessStack:
    gateway: ServerThread
    sims: dict[str, SimProcess]
    extra: list[ServerThread] = field(default_factory=list)

    @property
    def url(self) -> str:
        return self.gateway.url

    def stop(self) -> None:
        self.gateway.stop()
        for server in self.extra:
            server.stop()
        for sim in self.sims.values():
            sim.stop()


def start_process_stack(time_scale: float = 0.05, **over: Any) -> ProcessStack:
    """vLLM and llama.cpp simulators (2 slots) as processes, the gateway in a thread."""
    scale = ("--time-scale", str(time_scale))
    sims = {
        "vllm": SimProcess("vllm", "up-vllm", "--architecture", "hybrid", *scale),
        "llama": SimProcess("llamacpp", "up-llama", "--slots", "2", *scale),
    }
    for sim in sims.values():
        sim.start()
    settings = stack_settings({name: sim.url for name, sim in sims.items()}, **over)
    return ProcessStack(ServerThread(create_app(settings)).start(), sims)


LONG_STREAM = {
    "model": "m",
    "messages": [{"role": "user", "content": "go"}],
    "stream": True,
    "ignore_eos": True,
}


class GatewayProcess:
    """``turnout serve`` as its own process, so that it can be sent SIGTERM."""

    def __init__(self, engine_url: str, directory: Path, limits: dict[str, float]) -> None:
        """One llama.cpp engine at ``engine_url`` serving ``up`` as model ``m``; ``limits`` as configured."""
        self.port = free_port()
        config = directory / "turnout.toml"
        config.write_text(
            "[limits]\n"
            + "".join(f"{k} = {v}\n" for k, v in limits.items())
            + f'\n[[backends]]\nid = "llama"\nkind = "llamacpp"\nurl = "{engine_url}"\n'
            + "probe_interval_s = 0.2\ntimeouts = { probe = 10.0 }\n"
            + '\n[[models]]\nname = "m"\n[[models.deployments]]\nbackend = "llama"\nupstream_name = "up"\n'
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
            body = {**LONG_STREAM, "max_tokens": max_tokens}
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
