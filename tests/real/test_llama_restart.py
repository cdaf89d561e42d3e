"""A real llama-server restarted under the gateway: its slots are empty afterwards, and turnout knows."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from gateway.app import create_app
from gateway.settings import load_settings
from tests.real.llama_server import DEFAULT_ALIAS, LlamaServer
from tests.real.test_llama_gateway import probe
from tests.servers import ADMIN, ServerThread

pytestmark = [pytest.mark.real_llama, pytest.mark.timeout(300)]

SYSTEM = {"role": "system", "content": "You are a careful coding agent. " * 40}


@pytest.fixture
def server(llama_binary: Path, qwen35_gguf: Path, tmp_path: Path) -> Iterator[LlamaServer]:
    running = LlamaServer(llama_binary, qwen35_gguf, log_path=tmp_path / "llama.log", ctx_total=4096).start()
    try:
        yield running
    finally:
        running.stop()


def ask(url: str) -> httpx.Response:
    body = {"model": "tiny", "messages": [SYSTEM, {"role": "user", "content": "go"}], "max_tokens": 4}
    answer = httpx.post(url + "/v1/chat/completions", json=body, headers={"x-session-id": "s"}, timeout=60)
    assert answer.status_code == 200
    return answer


def test_the_work_counter_a_restart_resets_is_read(server: LlamaServer) -> None:
    """``llamacpp:n_decode_total`` (with --metrics) grows with every request: a lower one is a restart."""
    before = asyncio.run(probe(server.base_url)).work_done
    httpx.post(server.base_url + "/completion", json={"prompt": "hello", "n_predict": 4}, timeout=60)
    after = asyncio.run(probe(server.base_url)).work_done
    assert before is not None
    assert after is not None
    assert after > before


def test_a_restarted_llama_server_holds_no_warm_slot(
    server: LlamaServer, llama_binary: Path, qwen35_gguf: Path, tmp_path: Path
) -> None:
    settings = load_settings(
        None,
        backends=[{"id": "llama", "kind": "llamacpp", "url": server.base_url, "probe_interval_s": 0.2,
                   "timeouts": {"probe": 10.0}}],
        models=[{"name": "tiny", "architecture": "hybrid",
                 "deployments": [{"backend": "llama", "upstream_name": DEFAULT_ALIAS}]}],
    )  # fmt: skip
    gateway = ServerThread(create_app(settings)).start()
    again: LlamaServer | None = None
    try:
        ask(gateway.url)
        warm = ask(gateway.url)
        assert "warm slot" in warm.headers["x-turnout-route-reason"]
        assert warm.json()["usage"]["prompt_tokens_details"]["cached_tokens"] > 0
        server.stop()
        again = LlamaServer(
            llama_binary, qwen35_gguf, log_path=tmp_path / "again.log", ctx_total=4096, port=server.port
        ).start()
        deadline = time.monotonic() + 30
        while True:  # until the gateway saw it back (a probe every 0.2 s)
            health = httpx.get(gateway.url + "/health").json()["backends"]["llama"]
            if health == "ready" and not overview_leases(gateway.url):
                break
            assert time.monotonic() < deadline, health
            time.sleep(0.1)
            httpx.post(
                gateway.url + "/v1/messages/count_tokens",
                json={"model": "tiny", "messages": [{"role": "user", "content": "x"}]},
            )  # fmt: skip  (routing notices the restart)
        cold = ask(gateway.url)
        assert "warm slot" not in cold.headers["x-turnout-route-reason"]
        decision = httpx.get(gateway.url + "/admin/api/decisions?limit=1", headers=ADMIN).json()["data"][0]
        assert decision["candidates"][0]["expected_cached_tokens"] == 0
        assert cold.json()["usage"]["prompt_tokens_details"]["cached_tokens"] == 0  # the engine agrees
    finally:
        gateway.stop()
        if again is not None:
            again.stop()


def overview_leases(url: str) -> list[object]:
    backends = httpx.get(url + "/admin/api/overview", headers=ADMIN).json()["backends"]
    leases: list[object] = backends[0]["leases"]
    return leases


def test_a_real_llama_server_killed_mid_stream(llama_binary: Path, qwen35_gguf: Path, tmp_path: Path) -> None:
    """SIGKILL (as the OOM killer does) while it streams: the client gets the error event and the end
    of the stream within a second, and the backend is down for the next request at once."""
    server = LlamaServer(llama_binary, qwen35_gguf, log_path=tmp_path / "l.log", n_parallel=1, ctx_total=4096)
    server.start()
    settings = load_settings(
        None,
        backends=[{"id": "llama", "kind": "llamacpp", "url": server.base_url, "probe_interval_s": 30}],
        models=[{"name": "tiny", "architecture": "hybrid",
                 "deployments": [{"backend": "llama", "upstream_name": DEFAULT_ALIAS}]}],
    )  # fmt: skip
    gateway = ServerThread(create_app(settings)).start()
    try:
        body = {"model": "tiny", "messages": [{"role": "user", "content": "go"}], "stream": True,
                "max_tokens": 3500, "ignore_eos": True}  # fmt: skip
        events: list[str] = []
        with httpx.stream("POST", gateway.url + "/v1/chat/completions", json=body, timeout=60) as response:
            lines = response.iter_lines()
            for line in lines:
                if line.startswith("data:"):
                    events.append(line)
                if len(events) == 5:
                    break
            assert server.process is not None
            server.process.kill()
            killed = time.monotonic()
            events += [line for line in lines if line.startswith("data:")]
            ended = time.monotonic() - killed
        assert ended < 10  # at once: by the closed connection, not a timer (first byte 30 s, idle 60 s)
        assert events[-1] == "data: [DONE]"
        assert "upstream_error" in events[-2]
        health = httpx.get(gateway.url + "/health").json()
        assert health["backends"]["llama"] == "down"  # at once: the next probe is 30 s away
    finally:
        gateway.stop()
        server.stop()
