"""turnout in front of a real vLLM: probes, learned cache stats, length refusal, disconnect, usage relay.

One real server for the module (the tiny hybrid Qwen3-Next, ``max_model_len`` 4096, ``--block-size 32``
so the attention block is 64 tokens and cached prefixes are whole blocks) and one gateway in a thread
(profile ``cost``) whose only backend it is. ``max_tokens`` stays small except in the disconnect test,
which stops reading after two chunks.
"""

from __future__ import annotations

import asyncio
import json
import time
from collections.abc import Iterator, MutableMapping
from pathlib import Path
from typing import Any

import httpx
import pytest

from gateway.app import create_app
from policies import Health
from tests.latency_proxy import LatencyProxy
from tests.log_capture import capture_logs
from tests.real.conftest import qwen35_model
from tests.real.llama_server import LlamaServer
from tests.real.vllm_gateway_helpers import (
    BACKEND,
    CONFIGURED_BLOCK_SIZE,
    MAX_MODEL_LEN,
    MODEL,
    UPSTREAM,
    Gateway,
    completed,
    data_events,
    group_settings,
    metrics,
    probe,
    running_gateway,
)
from tests.real.vllm_server import VllmServer, VllmServerFactory
from tests.servers import ADMIN, ServerThread

# The first run prepares the vLLM venv (minutes) inside the first test's timeout.
pytestmark = [pytest.mark.real_vllm, pytest.mark.timeout(1200)]


@pytest.fixture(scope="module")
def real(vllm_server_module: VllmServerFactory) -> VllmServer:
    return vllm_server_module(
        served_model_name=UPSTREAM,
        max_model_len=MAX_MODEL_LEN,
        extra_args=["--block-size", str(CONFIGURED_BLOCK_SIZE)],
    )


@pytest.fixture(scope="module")
def block(real: VllmServer) -> int:
    size = real.attention_block_size()
    assert size is not None, real.log_tail()
    assert size >= CONFIGURED_BLOCK_SIZE
    return size


@pytest.fixture(scope="module")
def gateway(real: VllmServer) -> Iterator[Gateway]:
    with running_gateway(real.base_url) as running:
        yield running


@pytest.fixture
def logs() -> Iterator[list[MutableMapping[str, Any]]]:
    with capture_logs() as entries:
        yield entries


def test_probe_reads_the_real_server(real: VllmServer) -> None:
    """Health, served name, ``max_model_len`` as the context window, and the /metrics gauges, idle
    and with a request running."""
    idle = asyncio.run(probe(real.base_url))
    assert idle.health is Health.READY
    assert idle.served_names == (UPSTREAM,)
    assert idle.deployments[0].context_window == MAX_MODEL_LEN  # not the configured 8192
    assert (idle.running, idle.queued) == (0, 0)
    assert idle.kv_usage == 0.0
    assert idle.prefix_cache_queries is not None
    assert idle.prefix_cache_hits is not None

    body = {
        "model": UPSTREAM,
        "messages": [{"role": "user", "content": "go on and on " * 20}],
        "max_tokens": 1500,
        "ignore_eos": True,
        "stream": True,
    }
    with (
        httpx.Client(base_url=real.base_url, timeout=120) as client,
        client.stream("POST", "/v1/chat/completions", json=body) as response,
    ):
        lines = response.iter_lines()
        next(line for line in lines if line.startswith("data: ") and '"content":"' in line)
        busy = asyncio.run(probe(real.base_url))
    # vLLM publishes its running gauge with a lag that varies with load, so a probe taken mid-stream
    # may still read 0; parsing a 1 is pinned by the recorded fixture (tests/backends/test_parsers.py).
    assert busy.running in (0, 1)
    assert busy.queued == 0
    assert busy.kv_usage is not None
    assert 0.0 <= busy.kv_usage <= 1.0  # a gauge too, with the same lag
    assert busy.prefix_cache_queries is not None
    assert busy.prefix_cache_queries > idle.prefix_cache_queries
    assert idle.work_done is not None  # tokens processed: it going back tells a restart
    assert busy.work_done is not None
    assert busy.work_done > idle.work_done
    deadline = time.monotonic() + 5
    while metrics(real)["vllm:num_requests_running"] and time.monotonic() < deadline:
        time.sleep(0.05)


def test_learned_cache_stats_follow_the_engine(gateway: Gateway, real: VllmServer, block: int) -> None:
    """A 6-turn conversation: the learned block is whole engine blocks, and from turn 3 (after the
    first hit taught the hybrid model's reuse) the cost model's expected cached tokens are within one
    block of what vLLM then reported, every turn: the block vLLM reports on /metrics refines the one
    learned from the hits (a busy machine's run learned blocks of 128 from hits of 128 and 256, and
    predicted 256 of the 352 turn 4 reused)."""
    messages: list[dict[str, Any]] = [
        {"role": "system", "content": "You are a helpful assistant that routes requests. " * 3}
    ]
    series: list[tuple[str, int, int]] = []  # (request id, prompt_tokens, cached_tokens) per turn
    with httpx.Client(base_url=gateway.url, timeout=120, headers={"x-session-id": "real-vllm-6"}) as client:
        for turn in range(6):
            text = f"Turn {turn}: tell me about the gateway, its backends and their cache state. " * 4
            messages.append({"role": "user", "content": text})
            body = {"model": MODEL, "messages": messages, "max_tokens": 8, "temperature": 0}
            response = client.post("/v1/chat/completions", json=body)
            assert response.status_code == 200, response.text
            answer = response.json()
            usage = answer["usage"]
            cached = usage["prompt_tokens_details"]["cached_tokens"]
            series.append((response.headers["x-request-id"], usage["prompt_tokens"], cached))
            messages.append({"role": "assistant", "content": answer["choices"][0]["message"]["content"]})
        entries = {
            e["request_id"]: e for e in client.get("/admin/api/decisions", headers=ADMIN).json()["data"]
        }

    rows = []
    for request_id, prompt, cached in series:
        entry = entries[request_id]
        candidate = next(c for c in entry["candidates"] if c["backend"] == BACKEND)
        assert entry["outcome"]["cached_tokens"] == cached
        rows.append((prompt, cached, candidate["expected_cached_tokens"]))
    stats = gateway.learned()
    print(f"\nblock {block}; learned block {stats.block}, reuse {stats.reuse.value:.3f}")
    print("turn prompt cached expected")
    for turn, (prompt, cached, expected) in enumerate(rows, 1):
        print(f"{turn:4d} {prompt:6d} {cached:6d} {expected:8d}")
    assert rows[0][1] == 0
    assert all(cached % block == 0 for _, cached, _ in rows), rows
    assert stats.block > 0
    assert stats.block % block == 0, (stats.block, rows)
    misses = [
        (turn, expected, cached)
        for turn, (_, cached, expected) in enumerate(rows, 1)
        if turn >= 3 and abs(expected - cached) > block
    ]
    assert all(cached >= 2 * block for _, cached, _ in rows[2:]), rows
    assert misses == [], rows
    snapshot = gateway.app.state.core.fleet.snapshots()[0]
    assert snapshot.cache_block == block  # what /metrics says
    # and what its KV cache holds (the prefix cache's bound): this conversation fits, as predicted
    assert (snapshot.cache_tokens or 0) > sum(prompt for prompt, _, _ in rows), snapshot.cache_tokens


def test_too_long_prompt_is_refused_before_sending(gateway: Gateway, real: VllmServer) -> None:
    """turnout answers 400 ``context_length_exceeded`` naming 4096 without reaching vLLM, which
    would have refused the same body with its own 400 for the same reason."""
    # ~6000+ tokens in 42000 characters: under vLLM's character cap (13 characters per token for this
    # tokenizer), so its own refusal is the token-count one.
    messages = [{"role": "user", "content": "router " * 6000}]
    before = metrics(real)
    response = httpx.post(
        gateway.url + "/v1/chat/completions", json={"model": MODEL, "messages": messages}, timeout=60
    )
    assert response.status_code == 400, response.text
    error = response.json()["error"]
    assert error["code"] == "context_length_exceeded"
    assert str(MAX_MODEL_LEN) in error["message"]
    after = metrics(real)
    for name in ("vllm:prompt_tokens_total", "vllm:request_success_total", "vllm:num_requests_running"):
        assert after[name] == before[name], name

    own = httpx.post(
        real.base_url + "/v1/chat/completions", json={"model": UPSTREAM, "messages": messages}, timeout=60
    )
    assert own.status_code == 400
    own_error = own.json()["error"]
    assert (own_error["type"], own_error["param"]) == ("BadRequestError", "input_tokens")
    assert own_error["message"].startswith(
        f"This model's maximum context length is {MAX_MODEL_LEN} tokens. However, your prompt contains "
        f"at least {MAX_MODEL_LEN + 1} input tokens"
    )


def test_client_disconnect_aborts_the_request(real: VllmServer, logs: list[MutableMapping[str, Any]]) -> None:
    """When the client hangs up, turnout logs a 499 and closes its connection to vLLM while the
    answer is still being generated (seen by a proxy between them), and vLLM drops the request
    unfinished (judged by its own counters)."""
    max_tokens = 4000  # as long as the 4096-token window allows: seconds of generation on the CPU
    body = {
        "model": MODEL,
        "messages": [{"role": "user", "content": "go"}],
        "max_tokens": max_tokens,
        "ignore_eos": True,
        "stream": True,
    }
    proxy = LatencyProxy(real.port).start()
    try:
        with running_gateway(f"http://127.0.0.1:{proxy.port}") as gateway:
            before = metrics(real)
            with (
                httpx.Client(base_url=gateway.url, timeout=120) as client,
                client.stream("POST", "/v1/chat/completions", json=body) as response,
            ):
                assert response.status_code == 200
                chunks = response.iter_raw()
                next(chunks)
                next(chunks)  # the request is generating; leaving the block hangs up
            (record,) = completed(logs, 1)
            assert (record["status"], record["error"]) == (499, "client disconnected")
            (link,) = [link for link in proxy.links if b"POST /v1/chat/completions" in link.sent]
            assert link.client_left.wait(30), "turnout kept its connection to vLLM open"
            assert b"data: [DONE]" not in link.answered_when_client_left  # left while vLLM generated
    finally:
        proxy.stop()
    deadline = time.monotonic() + 30  # vLLM's counters catch up; the answer itself would take longer
    while (after := metrics(real))["vllm:num_requests_running"] != 0:
        assert time.monotonic() < deadline, "vLLM still runs the request the client left"
        time.sleep(0.5)
    generated = after["vllm:generation_tokens_total"] - before["vllm:generation_tokens_total"]
    print(f"\naborted after {generated:.0f} of {max_tokens} tokens")
    assert generated < max_tokens


@pytest.mark.parametrize("include_usage", [False, True])
def test_stream_usage_is_relayed_as_asked(
    gateway: Gateway, logs: list[MutableMapping[str, Any]], include_usage: bool
) -> None:
    """turnout always asks vLLM for the usage chunk; the client sees it only if it asked, and the
    request.completed line carries the usage either way."""
    body: dict[str, Any] = {
        "model": MODEL,
        "messages": [{"role": "user", "content": "Count to five."}],
        "max_tokens": 5,
        "ignore_eos": True,
        "stream": True,
    }
    if include_usage:
        body["stream_options"] = {"include_usage": True}
    with (
        httpx.Client(base_url=gateway.url, timeout=120) as client,
        client.stream("POST", "/v1/chat/completions", json=body) as response,
    ):
        assert response.status_code == 200
        raw = response.read()
    payloads = data_events(raw)
    assert payloads[-1] == "[DONE]"
    events = [json.loads(p) for p in payloads[:-1]]
    with_usage = [e for e in events if e.get("usage")]
    if include_usage:
        assert with_usage == [events[-1]]
        assert events[-1]["choices"] == []
        assert events[-1]["usage"]["completion_tokens"] == 5
    else:
        assert with_usage == []
        assert all(e["choices"] for e in events)
    assert all(e["model"] == MODEL for e in events)
    line = completed(logs, 1)[-1]
    assert line["stream"] is True
    assert line["status"] == 200
    assert line["completion_tokens"] == 5
    assert line["prompt_tokens"] > 0
    assert line["cached_tokens"] is not None


def test_running_gauge_is_back_to_zero(real: VllmServer) -> None:
    """Nothing this module started is left running on the engine."""
    deadline = time.monotonic() + 5
    while metrics(real)["vllm:num_requests_running"] and time.monotonic() < deadline:
        time.sleep(0.05)
    assert metrics(real)["vllm:num_requests_running"] == 0


def test_anthropic_messages_relay_from_real_vllm(gateway: Gateway) -> None:
    """The official anthropic SDK through turnout to vLLM's own /v1/messages, plain and streamed."""
    import anthropic

    claude = anthropic.Anthropic(base_url=gateway.url, api_key="unused", max_retries=0, timeout=120)
    asked = [{"role": "user", "content": "Say something about routers."}]
    message = claude.messages.create(model=MODEL, max_tokens=6, messages=asked)  # type: ignore[arg-type]
    assert message.model == MODEL
    assert message.usage.output_tokens <= 6
    with claude.messages.stream(model=MODEL, max_tokens=6, messages=asked) as stream:  # type: ignore[arg-type]
        list(stream.text_stream)
        final = stream.get_final_message()
    assert final.model == MODEL
    assert final.usage.output_tokens > 0
    counted = claude.messages.count_tokens(model=MODEL, messages=asked)  # type: ignore[arg-type]
    assert counted.input_tokens == message.usage.input_tokens + (message.usage.cache_read_input_tokens or 0)


def test_openai_responses_relay_from_real_vllm(gateway: Gateway) -> None:
    """The official openai SDK's Responses API through turnout to vLLM's /v1/responses."""
    import openai

    codex = openai.OpenAI(base_url=gateway.url + "/v1", api_key="unused", max_retries=0, timeout=120)
    response = codex.responses.create(model=MODEL, input="Say something about routers.", max_output_tokens=6)
    assert response.model == MODEL
    assert response.usage is not None
    assert response.usage.output_tokens <= 6
    events = list(codex.responses.create(model=MODEL, input="Say hi.", max_output_tokens=6, stream=True))
    assert events[0].type == "response.created"
    assert events[-1].type in ("response.completed", "response.incomplete")


GROUP_SLOT_CTX = 8192  # llama.cpp's slot: twice vLLM's window


@pytest.fixture(scope="module")
def llama_beside(llama_binary: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[LlamaServer]:
    """A real llama-server beside the module's vLLM, its slots larger than vLLM's window."""
    server = LlamaServer(
        llama_binary,
        qwen35_model(context=32768),  # trained longer than a slot: no cap
        log_path=tmp_path_factory.mktemp("group") / "llama-server.log",
        n_parallel=2,
        ctx_total=2 * GROUP_SLOT_CTX,
        extra_args=["--cache-ram", "0"],
    ).start()
    try:
        yield server
    finally:
        server.stop()


@pytest.mark.real_llama
def test_a_group_conversation_keeps_its_member_then_moves_when_it_outgrows_vllm(
    real: VllmServer, llama_beside: LlamaServer
) -> None:
    """Model group ``grp`` over the 27B-like model on the real vLLM (4,096-token window, the default
    member) and the larger one on the real llama-server (8,192 a slot): a conversation stays on its
    member while it fits, moves to llama.cpp when it outgrows vLLM's window (logged with its reason
    and models), and stays there (issue #28)."""
    settings = group_settings(real.base_url, llama_beside.base_url, llama_beside.alias)
    app = create_app(settings)
    server = ServerThread(app).start()
    try:
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline:  # both probed: their windows known
            if all(s.health is Health.READY for s in app.state.core.fleet.snapshots()):
                break
            time.sleep(0.05)
        messages: list[dict[str, str]] = []
        answered: list[tuple[str, str, str]] = []
        with httpx.Client(base_url=server.url, timeout=300) as client:
            # the first turn asks the member by name; the others ask the group
            for turn, (model, words) in enumerate(
                [("m-vllm", 600), ("grp", 900), ("grp", 900), ("grp", 2400), ("grp", 300)]
            ):
                messages.append({"role": "user", "content": f"turn {turn}: " + "router " * words})
                body = {"model": model, "messages": messages, "max_tokens": 4}
                response = client.post("/v1/chat/completions", json=body, headers={"x-session-id": "grows"})
                assert response.status_code == 200, response.text
                member = response.headers["x-turnout-model"]
                assert response.json()["model"] == member
                decision = client.get(
                    f"/admin/api/decisions/{response.headers['x-request-id']}", headers=ADMIN
                ).json()
                answered.append((member, response.headers["x-turnout-backend"], str(decision["moved"])))
                content = response.json()["choices"][0]["message"]["content"] or ""
                messages.append({"role": "assistant", "content": content})
                if turn == 3:
                    moved = decision["moved"]
                    assert moved is not None, answered
                    assert (moved["reason"], moved["from_model"], moved["to_model"]) == (
                        "context-too-long",
                        "m-vllm",
                        "m-llama",
                    ), moved
                    assert decision["prompt_tokens_estimate"] > MAX_MODEL_LEN
    finally:
        server.stop()
    members = [member for member, _, _ in answered]
    assert members == ["m-vllm", "m-vllm", "m-vllm", "m-llama", "m-llama"], answered
    assert [backend for _, backend, _ in answered] == ["vllm", "vllm", "vllm", "llama", "llama"]
