"""Start, wait for, and stop a real ``llama-server`` process for the tests.

The server always runs with explicit arguments: ``-np`` slots (2 by default) sharing ``-c`` total
context (split evenly: the KV cache is not unified with an explicit ``-np``), one compute thread
(``-t 1``: with more threads on a busy two-core machine ggml spin-waits and runs about 100x
slower), ``--metrics``, ``--slots`` and ``--alias``, bound to a free port on 127.0.0.1.  Its output
goes to a log file.  ``start()`` returns once ``/health`` answers 200; it records whether it saw
the 503 "Loading model" answer first.
"""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import time
from collections.abc import Sequence
from pathlib import Path
from types import TracebackType
from typing import Any, Protocol

import httpx
from msgspec.structs import replace

from backends.sim import SimConfig
from backends.sim.config import default_profile
from policies import Architecture

DEFAULT_ALIAS = "tiny-qwen35"
CLIENT_LIMITS = httpx.Limits(keepalive_expiry=1.0)
"""For a test's own client of a real engine: llama-server (and vLLM's uvicorn) close a connection idle
for 5 s, httpx keeps one 5 s; on a busy machine a request then raced the close ("Server disconnected
without sending a response", a busy run of tests/real/test_llama_contract.py). turnout's own
transport lets go after 2 s (``backends.transport.UPSTREAM_KEEPALIVE_S``)."""
BIND_ERROR = "couldn't bind HTTP server socket"


def free_port(host: str = "127.0.0.1") -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind((host, 0))
        return int(sock.getsockname()[1])


class LlamaServerError(RuntimeError):
    """The server exited or did not become ready; the message ends with its log tail."""


class LlamaServer:
    """One ``llama-server`` process.  Use ``with LlamaServer(...) as server:`` or start()/stop()."""

    def __init__(
        self,
        binary: Path,
        model: Path,
        *,
        log_path: Path,
        alias: str = DEFAULT_ALIAS,
        n_parallel: int = 2,
        ctx_total: int = 4096,
        threads: int = 1,
        extra_args: Sequence[str] = (),
        host: str = "127.0.0.1",
        port: int | None = None,
        startup_timeout: float = 120.0,
    ) -> None:
        self.binary = Path(binary)
        self.model = Path(model)
        self.log_path = Path(log_path)
        self.alias = alias
        self.n_parallel = n_parallel
        self.ctx_total = ctx_total
        self.threads = threads
        self.extra_args = tuple(extra_args)
        self.host = host
        self._port_chosen = port is None
        self.port = port if port is not None else free_port(host)
        self.startup_timeout = startup_timeout
        self.process: subprocess.Popen[bytes] | None = None
        self.saw_loading_503 = False
        self.startup_seconds: float | None = None

    @property
    def base_url(self) -> str:
        return f"http://{self.host}:{self.port}"

    @property
    def args(self) -> list[str]:
        return [
            str(self.binary),
            "-m",
            str(self.model),
            "--alias",
            self.alias,
            "-np",
            str(self.n_parallel),
            "-c",
            str(self.ctx_total),
            "-t",
            str(self.threads),
            "--host",
            self.host,
            "--port",
            str(self.port),
            "--metrics",
            "--slots",
            "--temp",
            "0",  # greedy: a random-weight model gives the same text every run
            *self.extra_args,
        ]

    def log_text(self) -> str:
        try:
            return self.log_path.read_text(errors="replace")
        except FileNotFoundError:
            return ""

    def log_tail(self, lines: int = 40) -> str:
        return "\n".join(self.log_text().splitlines()[-lines:])

    def start(self, *, bind_retries: int = 3) -> LlamaServer:
        """Start the server and wait until ``/health`` is 200.  If the port was taken meanwhile
        (and it was chosen here), retry on another free port."""
        for attempt in range(bind_retries + 1):
            try:
                return self._start_once()
            except LlamaServerError as error:
                if not (self._port_chosen and BIND_ERROR in str(error)) or attempt == bind_retries:
                    raise
                self.process = None
                self.port = free_port(self.host)
        raise AssertionError("unreachable")

    def _start_once(self) -> LlamaServer:
        if self.process is not None:
            raise RuntimeError("already started")
        self.log_path.parent.mkdir(parents=True, exist_ok=True)
        # Only the explicit arguments count: drop LLAMA_ARG_* settings inherited from the caller.
        env = {key: value for key, value in os.environ.items() if not key.startswith("LLAMA_ARG_")}
        started = time.monotonic()
        with open(self.log_path, "wb") as log:
            self.process = subprocess.Popen(
                self.args,
                stdin=subprocess.DEVNULL,
                stdout=log,
                stderr=subprocess.STDOUT,
                env=env,
                start_new_session=True,  # a Ctrl-C in the terminal does not reach it twice
            )
        try:
            self._wait_ready(started)
        except BaseException:
            self.stop()
            raise
        self.startup_seconds = time.monotonic() - started
        return self

    def _wait_ready(self, started: float) -> None:
        assert self.process is not None
        deadline = started + self.startup_timeout
        with httpx.Client(base_url=self.base_url, timeout=5.0) as client:
            while True:
                code = self.process.poll()
                if code is not None:
                    raise LlamaServerError(
                        f"llama-server exited with code {code} during startup\n"
                        f"command: {' '.join(self.args)}\n--- log tail ---\n{self.log_tail()}"
                    )
                try:
                    response = client.get("/health")
                except httpx.TransportError:
                    pass  # not listening yet
                else:
                    if response.status_code == 200:
                        return
                    if response.status_code == 503:
                        self.saw_loading_503 = True
                if time.monotonic() > deadline:
                    raise LlamaServerError(
                        f"llama-server not ready after {self.startup_timeout:.0f} s\n"
                        f"--- log tail ---\n{self.log_tail()}"
                    )
                time.sleep(0.02)

    def stop(self, timeout: float = 15.0) -> int | None:
        """SIGTERM, then SIGKILL after ``timeout`` seconds; return the exit code."""
        process = self.process
        if process is None:
            return None
        if process.poll() is None:
            process.send_signal(signal.SIGTERM)
            try:
                process.wait(timeout)
            except subprocess.TimeoutExpired:
                process.kill()
                process.wait(timeout)
        return process.returncode

    @property
    def running(self) -> bool:
        return self.process is not None and self.process.poll() is None

    def __enter__(self) -> LlamaServer:
        return self.start()

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.stop()


class LlamaServerFactory(Protocol):
    """The ``llama_server`` fixture: starts a server on the tiny qwen35 model (or ``model``)."""

    def __call__(
        self,
        *,
        model: Path | None = ...,
        alias: str = ...,
        n_parallel: int = ...,
        ctx_total: int = ...,
        extra_args: Sequence[str] = ...,
        startup_timeout: float = ...,
    ) -> LlamaServer: ...


def twin_sim_config(
    slot_ctx: int, slots: int = 2, ubatch: int = 512, batch: int = 2048, **overrides: Any
) -> SimConfig:
    """The llama.cpp simulator configured like a test llama-server (tiny hybrid model, ``-np slots``,
    ``slot_ctx`` tokens per slot, ``--ubatch-size ubatch --batch-size batch``: the server's defaults,
    which place its first near-end checkpoint ``min(batch, 4 + ubatch)`` before a prompt's end), for
    contract tests."""
    base = default_profile("llamacpp")
    config: dict[str, Any] = {
        "kind": "llamacpp",
        "model": DEFAULT_ALIAS,
        "context_window": slot_ctx,
        "slots": slots,
        "architecture": Architecture.HYBRID,
        "time_scale": 0.001,
        "profile": replace(base, prefill=replace(base.prefill, ubatch=ubatch, batch=batch)),
    }
    return SimConfig(**(config | overrides))


class LlamaRouterServer(LlamaServer):
    """``llama-server`` in router mode over ``model`` (a folder of GGUFs, each a model by its file's
    stem): one loaded at a time (``--models-max 1``), none loaded by a request
    (``--no-models-autoload``), slots saved to ``slot_dir``. Every other flag goes to the instances."""

    def __init__(self, binary: Path, models_dir: Path, *, slot_dir: Path, **kwargs: Any) -> None:
        super().__init__(binary, models_dir, **kwargs)
        self.slot_dir = slot_dir

    @property
    def args(self) -> list[str]:
        single = super().args
        drop = {"-m", "--alias"}
        kept = [a for i, a in enumerate(single) if a not in drop and (i == 0 or single[i - 1] not in drop)]
        return [
            *kept,
            "--models-dir", str(self.model), "--models-max", "1", "--no-models-autoload",
            "--slot-save-path", str(self.slot_dir),
        ]  # fmt: skip
