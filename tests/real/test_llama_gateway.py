"""turnout in front of a real llama-server: probes, relay, accounting, disconnect, length checks."""

from __future__ import annotations

import asyncio
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import openai
import pytest
import structlog
from structlog.testing import LogCapture

from backends.base import BackendSpec
from backends.llamacpp import LlamaCppAdapter
from backends.parsers.llamacpp import parse_metrics
from gateway.app import create_app
from gateway.settings import load_settings
from policies import Deployment, EngineKind, Health
from tests.real.llama_server import DEFAULT_ALIAS, LlamaServer, LlamaServerFactory
from tests.servers import ServerThread

pytestmark = [pytest.mark.real_llama, pytest.mark.timeout(300)]

SLOT_CTX = 2048
MODEL = "tiny"


PROBE_TIMEOUT_S = 30.0
"""These tests read what a probe parses, not how fast: a real engine busy on a 2-core machine may be
slow to answer (the gateway's own 2 s probe timeout would call it down)."""


def spec(url: str) -> BackendSpec:
    deployment = Deployment(MODEL, "llama", DEFAULT_ALIAS, context_window=8192)
    return BackendSpec(
        "llama", EngineKind.LLAMACPP, url, deployments=(deployment,), probe_timeout=PROBE_TIMEOUT_S
    )


async def probe(url: str) -> Any:
    async with httpx.AsyncClient() as client:
        return await LlamaCppAdapter(spec(url), client).probe()


@pytest.fixture(scope="module")
def real(llama_server_module: LlamaServerFactory) -> LlamaServer:
    return llama_server_module(n_parallel=2, ctx_total=2 * SLOT_CTX)


@pytest.fixture(scope="module")
def gateway(real: LlamaServer) -> Iterator[ServerThread]:
    settings = load_settings(
        None,
        backends=[
            {
                "id": "llama",
                "kind": "llamacpp",
                "url": real.base_url,
                "probe_interval_s": 0.2,
                "timeouts": {"probe": 10.0},
            }
        ],
        models=[
            {
                "name": MODEL,
                "architecture": "hybrid",
                "deployments": [{"backend": "llama", "upstream_name": DEFAULT_ALIAS}],
            }
        ],
    )
    server = ServerThread(create_app(settings)).start()
    try:
        yield server
    finally:
        server.stop()


def test_probe_reads_the_real_server(real: LlamaServer) -> None:
    snapshot = asyncio.run(probe(real.base_url))
    assert snapshot.health is Health.READY
    assert snapshot.total_slots == 2
    assert [(s.id, s.n_ctx) for s in snapshot.slots] == [(0, SLOT_CTX), (1, SLOT_CTX)]
    assert snapshot.served_names == (DEFAULT_ALIAS,)
    assert snapshot.deployments[0].context_window == SLOT_CTX  # the per-slot window, not the configured 8192
    assert (snapshot.running, snapshot.queued) == (0, 0)


def test_probe_sees_loading_then_ready(llama_binary: Path, qwen35_gguf: Path, tmp_path: Path) -> None:
    """llama-server answers 503 "Loading model" while it loads; the probe calls that loading, then ready."""
    server = LlamaServer(
        llama_binary, qwen35_gguf, log_path=tmp_path / "load.log", n_parallel=1, ctx_total=1024
    )
    process = subprocess.Popen(server.args, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    seen: list[Health] = []
    try:
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline and (not seen or seen[-1] is not Health.READY):
            state = asyncio.run(probe(server.base_url)).health
            if not seen or seen[-1] is not state:
                seen.append(state)
    finally:
        process.terminate()
        process.wait(timeout=15)
    assert seen[-1] is Health.READY
    assert Health.LOADING in seen, seen
    assert seen.index(Health.LOADING) < seen.index(Health.READY)


def test_sdk_through_the_gateway(gateway: ServerThread) -> None:
    sdk = openai.OpenAI(base_url=gateway.url + "/v1", api_key="unused", max_retries=0, timeout=120)
    result = sdk.chat.completions.create(
        model=MODEL, messages=[{"role": "user", "content": "hi"}], max_tokens=4
    )
    assert result.model == MODEL
    assert result.usage is not None
    assert result.usage.completion_tokens <= 4
    chunks = list(
        sdk.chat.completions.create(
            model=MODEL,
            messages=[{"role": "user", "content": "hi"}],
            max_tokens=4,
            stream=True,
            stream_options={"include_usage": True},
        )
    )
    assert chunks[-1].usage is not None
    assert all(chunk.model == MODEL for chunk in chunks)


def test_gateway_accounting_matches_the_server(gateway: ServerThread) -> None:
    """Over a pinned growing conversation, the logged cached tokens are the server's own ``cache_n``."""
    capture = LogCapture()
    previous = structlog.get_config()
    structlog.configure(processors=[capture])
    messages: list[dict[str, Any]] = [{"role": "system", "content": "You are terse."}]
    reported: list[int] = []
    try:
        with httpx.Client(base_url=gateway.url, timeout=120) as client:
            for turn in range(4):
                messages.append({"role": "user", "content": f"Turn {turn}: tell me about slot {turn}."})
                body = {"model": MODEL, "messages": messages, "max_tokens": 6, "id_slot": 0, "stream": True}
                with client.stream("POST", "/v1/chat/completions", json=body) as response:
                    raw = response.read()
                assert response.status_code == 200, (turn, raw)  # turnout's error says what went wrong
                timings = [line for line in raw.split(b"\n\n") if b'"timings"' in line][-1]
                reported.append(int(timings.split(b'"cache_n":')[1].split(b",")[0]))
                content = b"".join(
                    part.split(b'"content":"')[1].split(b'"')[0]
                    for part in raw.split(b"\n\n")
                    if b'"content":"' in part
                )
                messages.append({"role": "assistant", "content": content.decode()})
        deadline = time.monotonic() + 30  # a stream's line is written after its last event
        while (
            len([e for e in capture.entries if e["event"] == "request.completed"]) < 4
            and time.monotonic() < deadline
        ):
            time.sleep(0.01)
    finally:
        structlog.configure(**previous)
    logged = [e["cached_tokens"] for e in capture.entries if e["event"] == "request.completed"]
    assert logged == reported
    assert reported[0] == 0
    assert all(later > 0 for later in reported[1:])


def test_disconnect_frees_the_slot(gateway: ServerThread, real: LlamaServer) -> None:
    body = {
        "model": MODEL,
        "messages": [{"role": "user", "content": "go"}],
        "max_tokens": 4000,
        "ignore_eos": True,
    }
    with httpx.Client(base_url=gateway.url, timeout=120) as client:
        with client.stream("POST", "/v1/chat/completions", json={**body, "stream": True}) as response:
            assert response.status_code == 200, response.read()
            chunks = response.iter_raw()
            next(chunks)
            next(chunks)
            busy = httpx.get(real.base_url + "/slots").json()
            assert any(slot["is_processing"] for slot in busy)
        closed = time.monotonic()
    while time.monotonic() - closed < 30:  # ends as soon as the slot is free
        if not any(slot["is_processing"] for slot in httpx.get(real.base_url + "/slots").json()):
            break
        time.sleep(0.05)
    slots = httpx.get(real.base_url + "/slots").json()
    assert not any(slot["is_processing"] for slot in slots)
    # freed by the cancel, not by the answer's end
    assert max(slot.get("next_token", [{}])[0].get("n_decoded", 0) for slot in slots) < 4000


def test_prompt_longer_than_the_slot_is_refused_before_sending(
    gateway: ServerThread, real: LlamaServer
) -> None:
    before = parse_metrics(httpx.get(real.base_url + "/metrics").text)
    long_prompt = [{"role": "user", "content": "router " * 4000}]
    response = httpx.post(
        gateway.url + "/v1/chat/completions", json={"model": MODEL, "messages": long_prompt}
    )
    assert response.status_code == 400
    error = response.json()["error"]
    assert error["code"] == "context_length_exceeded"
    assert str(SLOT_CTX) in error["message"]
    after = parse_metrics(httpx.get(real.base_url + "/metrics").text)
    assert after.prompt_tokens == before.prompt_tokens
    assert (after.processing, after.deferred) == (0, 0)
