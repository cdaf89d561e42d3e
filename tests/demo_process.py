"""``turnout demo`` as a user starts it, in a process of its own, for the tests that need the real thing."""

from __future__ import annotations

import os
import re
import subprocess
import sys
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import IO, Any

import httpx

from tests.real.llama_server import free_port


@dataclass(frozen=True)
class RunningDemo:
    process: subprocess.Popen[str]
    url: str
    banner: str

    @property
    def token(self) -> str:
        """The admin token the demo made and printed."""
        found = re.search(r"admin token: (\S+)\)", self.banner)
        assert found is not None, self.banner
        return found.group(1)

    @property
    def simulators(self) -> list[str]:
        return re.findall(r"simulator on (http://127\.0\.0\.1:\d+)", self.banner)


@contextmanager
def running_demo(cache: Path, *, stderr: IO[Any] | None = None, **env: str) -> Iterator[RunningDemo]:
    """The demo on a free port, its cache (log, recording) under ``cache``, ready to answer; stopped
    with SIGTERM (it stops its simulators on it: SIGKILL would orphan them)."""
    port = free_port()
    environment = {**os.environ, "TURNOUT_PORT": str(port), "TURNOUT_CACHE": str(cache), **env}
    environment.pop("TURNOUT_RECORD__PATH", None)
    environment.pop("TURNOUT_ADMIN__TOKEN", None)  # the demo makes its own and prints it
    process = subprocess.Popen(
        [sys.executable, "-m", "gateway", "demo"],
        env=environment,
        stdout=subprocess.PIPE,
        stderr=stderr,
        text=True,
    )
    try:
        banner = ""
        assert process.stdout is not None
        for line in process.stdout:
            banner += line
            if line.startswith("Ctrl-C"):
                break
        url = f"http://127.0.0.1:{port}"
        deadline = time.monotonic() + 60
        while True:
            try:
                if httpx.get(url + "/health", timeout=5).status_code == 200:
                    break
            except httpx.HTTPError:
                pass
            assert time.monotonic() < deadline, "the demo's gateway never answered /health"
            time.sleep(0.1)
        yield RunningDemo(process, url, banner)
    finally:
        if process.poll() is None:
            process.terminate()
            try:
                process.wait(timeout=30)
            except subprocess.TimeoutExpired:
                process.kill()
