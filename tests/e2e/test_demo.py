"""``turnout demo`` as a user runs it: a process that serves, then stops all its children on SIGTERM."""

from __future__ import annotations

import json
import shlex
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from policies.sessions import session_label
from tests.demo_process import running_demo


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
def cache(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tmp_path_factory.mktemp("turnout-cache")


@pytest.fixture(scope="module")
def recording(cache: Path) -> Path:
    return cache / "demo" / "traffic.jsonl"  # the demo records there unless told otherwise


@pytest.fixture(scope="module")
def demo(cache: Path) -> Iterator[tuple[subprocess.Popen[str], str, list[str]]]:
    """The demo; its terminal below the banner goes to ``terminal.txt``; the simulators' URLs, then
    the admin token."""
    with (
        (cache / "terminal.txt").open("w") as terminal,
        running_demo(cache, stderr=terminal, TURNOUT_LOG_FORMAT="json") as running,
    ):
        yield running.process, running.url, [*running.simulators, running.token]


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


def test_demo_keeps_its_banner_in_sight_and_its_log_in_a_file(
    demo: tuple[subprocess.Popen[str], str, list[str]], cache: Path
) -> None:
    """Every request's log line goes to the demo's log file, not under the banner with its token."""
    _, url, _ = demo
    log = cache / "demo" / "turnout.log"
    httpx.post(
        url + "/v1/chat/completions",
        json={"model": "qwen3.8-27b", "messages": [{"role": "user", "content": "logged"}], "max_tokens": 2},
        timeout=30,
    )
    deadline = time.monotonic() + 30
    while not log.exists() or "request.completed" not in log.read_text():
        assert time.monotonic() < deadline, "no request line in the demo's log file"
        time.sleep(0.2)
    assert "request.completed" not in (cache / "terminal.txt").read_text()


def test_the_favicon_is_served(demo: tuple[subprocess.Popen[str], str, list[str]]) -> None:
    _, url, _ = demo
    icon = httpx.get(url + "/favicon.ico", timeout=30)
    assert icon.status_code == 200
    assert icon.headers["content-type"].startswith("image/svg+xml")
    assert icon.content.startswith(b"<svg")


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


def test_the_demo_traffic_recorded_replays_and_the_what_if_agrees(
    demo: tuple[subprocess.Popen[str], str, list[str]], recording: Path, tmp_path: Path
) -> None:
    """Issue #29's proof: the demo's own traffic, recorded by default (issue #41), replays under
    ``turnout replay``, and the what-if page's numbers for it are what the command it shows prints."""
    _, url, found = demo
    headers = {"authorization": f"Bearer {found[-1]}"}
    deadline = time.monotonic() + 90
    while not recording.exists() or len(recording.read_text().splitlines()) < 4:
        assert time.monotonic() < deadline, "the demo recorded fewer than 4 requests in 90 s"
        time.sleep(0.5)
    report = tmp_path / "replayed.json"
    replayed = subprocess.run(
        [sys.executable, "-m", "gateway", "replay", str(recording), "--no-oracle", "--json", str(report)],
        capture_output=True, text=True, timeout=300,
    )  # fmt: skip
    assert replayed.returncode == 0, replayed.stderr
    assert json.loads(report.read_text())["profiles"]["cost"]["requests"] >= 4
    answer = httpx.post(url + "/admin/api/whatif", json={"minutes": 10}, headers=headers, timeout=300)
    assert answer.status_code == 200, answer.text
    result = answer.json()
    argv = shlex.split(result["command"])
    argv[argv.index("--json") + 1] = str(tmp_path / "by-hand.json")
    by_hand = subprocess.run(
        [sys.executable, "-m", "gateway", *argv[1:]], capture_output=True, text=True, timeout=300
    )
    assert by_hand.returncode == 0, by_hand.stderr
    assert json.loads((tmp_path / "by-hand.json").read_text())["profiles"] == result["profiles"]


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
