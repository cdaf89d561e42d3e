"""``turnout demo`` as a user runs it: a process that serves, then stops all its children on SIGTERM."""

from __future__ import annotations

import os
import re
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Iterator

import httpx
import pytest

from gateway.routing import session_label


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port: int = sock.getsockname()[1]
        return port


def refused(url: str) -> bool:
    try:
        httpx.get(url + "/health", timeout=5)
    except httpx.ConnectError:
        return True
    except httpx.HTTPError:  # still closing: not refused yet
        return False
    return False


@pytest.fixture(scope="module")
def demo() -> Iterator[tuple[subprocess.Popen[str], str, list[str]]]:
    port = free_port()
    env = {**os.environ, "TURNOUT_PORT": str(port), "TURNOUT_LOG_FORMAT": "json"}
    env.pop("TURNOUT_ADMIN__TOKEN", None)  # the demo makes its own and prints it
    process = subprocess.Popen(
        [sys.executable, "-m", "gateway", "demo"],
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.DEVNULL,
        text=True,
    )
    url = f"http://127.0.0.1:{port}"
    banner: list[str] = []
    assert process.stdout is not None
    for line in process.stdout:
        banner.append(line)
        if line.startswith("Ctrl-C"):
            break
    sims = re.findall(r"simulator on (http://127\.0\.0\.1:\d+)", "".join(banner))
    sims += re.findall(r"admin token: (\S+)\)", "".join(banner))  # last: the dashboard's token
    deadline = time.monotonic() + 60
    while True:
        try:
            if httpx.get(url + "/health", timeout=5).status_code == 200:
                break
        except httpx.HTTPError:
            pass
        assert time.monotonic() < deadline, "the demo's gateway never answered /health"
        time.sleep(0.1)
    try:
        yield process, url, sims
    finally:
        if (
            process.poll() is None
        ):  # SIGTERM first: the demo stops its simulators on it, SIGKILL would orphan them
            process.terminate()
            try:
                process.wait(timeout=15)
            except subprocess.TimeoutExpired:
                process.kill()


def test_demo_serves_both_models_and_their_group(demo: tuple[subprocess.Popen[str], str, list[str]]) -> None:
    _, url, found = demo
    sims = found[:-1]
    assert len(sims) == 3
    models = httpx.get(url + "/v1/models").json()["data"]
    assert {m["id"] for m in models} == {"qwen3.8-27b", "qwen3.8-flash-next", "qwen3.8"}
    every = {"vllm", "llama-27b", "llama-moe"}
    for model, backends in (
        ("qwen3.8-27b", {"vllm", "llama-27b"}),
        ("qwen3.8-flash-next", {"llama-moe"}),
        ("qwen3.8", every),
    ):
        response = httpx.post(
            url + "/v1/chat/completions",
            json={"model": model, "messages": [{"role": "user", "content": "Hello!"}], "max_tokens": 4},
            timeout=30,
        )
        assert response.status_code == 200, response.text
        assert response.headers["x-turnout-backend"] in backends


def test_demo_prints_the_dashboard_and_its_token(demo: tuple[subprocess.Popen[str], str, list[str]]) -> None:
    _, url, found = demo
    token = found[-1]
    assert httpx.get(url + "/admin/api/overview").status_code == 401
    overview = httpx.get(url + "/admin/api/overview", headers={"authorization": f"Bearer {token}"})
    assert [b["id"] for b in overview.json()["backends"]] == ["vllm", "llama-moe", "llama-27b"]


def test_demo_sends_background_traffic(demo: tuple[subprocess.Popen[str], str, list[str]]) -> None:
    """Without anyone asking, the demo's two agents show up in the decision log (one request / 4 s)."""
    _, url, found = demo
    headers = {"authorization": f"Bearer {found[-1]}"}
    agents = {session_label("h:demo-agent-1"), session_label("h:demo-agent-2")}
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        entries = httpx.get(url + "/admin/api/decisions", headers=headers).json()["data"]
        if {e["session"] for e in entries if e["status"] == 200} >= agents:
            return
        time.sleep(0.5)
    raise AssertionError(f"no background traffic from both demo agents: {entries}")


def test_demo_stops_everything_on_sigterm(demo: tuple[subprocess.Popen[str], str, list[str]]) -> None:
    process, url, found = demo
    sims = found[:-1]
    process.send_signal(signal.SIGTERM)
    assert process.wait(timeout=30) in (0, 143, -signal.SIGTERM)
    assert refused(url)
    deadline = time.monotonic() + 30
    while not all(refused(sim) for sim in sims) and time.monotonic() < deadline:
        time.sleep(0.1)
    assert all(refused(sim) for sim in sims)
