"""Smoke test of a real llama-server on the tiny random-weight qwen35 (hybrid) model.

The server has 2 slots of 2048 tokens each (``-c 4096``) and logs at ``-lv 4`` so the
context-checkpoint lines are visible.
"""

from __future__ import annotations

import json
import math
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from tests.real.llama_server import CLIENT_LIMITS, LlamaServer, LlamaServerFactory

pytestmark = [pytest.mark.real_llama, pytest.mark.timeout(300)]

ALIAS = "tiny-qwen35"
N_SLOTS = 2
CTX_TOTAL = 4096
N_VOCAB = 151936  # ggml-vocab-qwen2.gguf
# With a hybrid model the server restores the newest context checkpoint at or before the point
# where a new prompt leaves the cached tokens. One is always taken 4 tokens before a prompt's end.
CHECKPOINT_SLACK = 4


@pytest.fixture(scope="module")
def server(
    llama_binary: Path, qwen35_gguf: Path, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[LlamaServer]:
    log_path = tmp_path_factory.mktemp("llama-smoke") / "llama-server.log"
    with LlamaServer(
        llama_binary,
        qwen35_gguf,
        log_path=log_path,
        alias=ALIAS,
        n_parallel=N_SLOTS,
        ctx_total=CTX_TOTAL,
        extra_args=["-lv", "4"],
    ) as started:
        print(f"\nllama-server ready in {started.startup_seconds:.2f} s (saw 503: {started.saw_loading_503})")
        yield started


@pytest.fixture
def client(server: LlamaServer) -> Iterator[httpx.Client]:
    with httpx.Client(
        base_url=server.base_url, timeout=httpx.Timeout(120.0, connect=10.0), limits=CLIENT_LIMITS
    ) as c:
        yield c


def chat(client: httpx.Client, messages: list[dict[str, Any]], **extra: Any) -> dict[str, Any]:
    response = client.post("/v1/chat/completions", json={"messages": messages, "max_tokens": 8, **extra})
    assert response.status_code == 200, response.text
    body: dict[str, Any] = response.json()
    return body


def sse_events(response: httpx.Response) -> Iterator[str]:
    """``data:`` payloads of an SSE stream, decoded as UTF-8 (llama-server sends no charset)."""
    buffer = b""
    for chunk in response.iter_bytes():
        buffer += chunk
        while b"\n" in buffer:
            raw, buffer = buffer.split(b"\n", 1)
            line = raw.decode("utf-8").rstrip("\r")
            if line.startswith("data:"):
                yield line[len("data:") :].strip()
    assert not buffer.strip(), f"unterminated SSE line: {buffer!r}"


def check_timings(timings: dict[str, Any], usage: dict[str, Any]) -> None:
    for key in ("cache_n", "prompt_n", "prompt_ms", "predicted_n", "predicted_ms"):
        assert key in timings, timings
    assert timings["cache_n"] + timings["prompt_n"] == usage["prompt_tokens"]
    assert timings["predicted_n"] == usage["completion_tokens"]
    assert usage["prompt_tokens_details"]["cached_tokens"] == timings["cache_n"]
    assert usage["total_tokens"] == usage["prompt_tokens"] + usage["completion_tokens"]


def test_health(server: LlamaServer, client: httpx.Client) -> None:
    response = client.get("/health")
    assert response.status_code == 200
    assert response.json() == {"status": "ok"}
    assert server.running


def test_props(client: httpx.Client) -> None:
    props = client.get("/props").json()
    assert props["total_slots"] == N_SLOTS
    assert props["model_alias"] == ALIAS
    assert props["default_generation_settings"]["n_ctx"] == CTX_TOTAL // N_SLOTS
    assert "<|im_start|>" in props["chat_template"]


def test_slots(client: httpx.Client) -> None:
    slots = client.get("/slots").json()
    assert [slot["id"] for slot in slots] == list(range(N_SLOTS))
    assert all(slot["n_ctx"] == CTX_TOTAL // N_SLOTS for slot in slots)


def test_metrics(client: httpx.Client) -> None:
    response = client.get("/metrics")
    assert response.status_code == 200
    assert response.headers["content-type"].startswith("text/plain")
    for name in ("prompt_tokens_total", "tokens_predicted_total", "requests_processing", "requests_deferred"):
        assert f"llamacpp:{name}" in response.text


def test_models(client: httpx.Client) -> None:
    models = client.get("/v1/models").json()
    [model] = models["data"]
    assert model["id"] == ALIAS
    assert model["meta"]["n_ctx"] == CTX_TOTAL // N_SLOTS
    assert model["meta"]["n_vocab"] == N_VOCAB
    assert model["meta"]["n_embd"] == 64


def test_chat_non_stream(client: httpx.Client) -> None:
    started = time.monotonic()
    body = chat(
        client,
        [{"role": "user", "content": "Say something about railways."}],
        logprobs=True,
        top_logprobs=3,
        seed=1,
    )
    print(f"\nnon-stream chat: {time.monotonic() - started:.3f} s, timings {body['timings']}")
    assert body["object"] == "chat.completion"
    assert body["model"] == ALIAS
    [choice] = body["choices"]
    assert choice["finish_reason"] in ("length", "stop")
    assert isinstance(choice["message"]["content"], str)
    usage = body["usage"]
    assert 1 <= usage["completion_tokens"] <= 8
    check_timings(body["timings"], usage)
    # random weights, but finite activations: every log-probability is a finite number
    entries = choice["logprobs"]["content"]
    assert len(entries) == usage["completion_tokens"]
    for entry in entries:
        assert math.isfinite(entry["logprob"])
        assert entry["logprob"] <= 0
        assert all(math.isfinite(top["logprob"]) for top in entry["top_logprobs"])


def test_chat_template_is_plain_chatml(client: httpx.Client) -> None:
    parts = [{"type": "text", "text": "Hello"}, {"type": "text", "text": "world"}]
    messages = [{"role": "system", "content": "Be brief."}, {"role": "user", "content": parts}]
    response = client.post("/apply-template", json={"messages": messages})
    assert response.status_code == 200, response.text
    prompt = response.json()["prompt"]
    # the server joins text parts with a newline before templating
    assert prompt == (
        "<|im_start|>system\nBe brief.<|im_end|>\n"
        "<|im_start|>user\nHello\nworld<|im_end|>\n"
        "<|im_start|>assistant\n"
    )
    body = chat(client, [{"role": "user", "content": parts}], max_tokens=1)
    assert body["usage"]["completion_tokens"] == 1


def test_chat_stream(client: httpx.Client) -> None:
    payload = {
        "messages": [{"role": "user", "content": "Stream a few words about bridges."}],
        "max_tokens": 8,
        "stream": True,
        "stream_options": {"include_usage": True},
        "seed": 2,
    }
    chunks: list[dict[str, Any]] = []
    done = False
    started = time.monotonic()
    with client.stream("POST", "/v1/chat/completions", json=payload) as response:
        assert response.status_code == 200
        assert response.headers["content-type"].startswith("text/event-stream")
        for data in sse_events(response):
            assert not done, "data after [DONE]"
            if data == "[DONE]":
                done = True
                continue
            chunks.append(json.loads(data))
    print(f"\nstream chat: {time.monotonic() - started:.3f} s, {len(chunks)} chunks")
    assert done
    assert chunks[0]["object"] == "chat.completion.chunk"
    assert chunks[0]["choices"][0]["delta"].get("role") == "assistant"
    finish = [c for c in chunks if c["choices"] and c["choices"][0].get("finish_reason")]
    assert [c["choices"][0]["finish_reason"] for c in finish] in (["length"], ["stop"])
    text = "".join(c["choices"][0]["delta"].get("content") or "" for c in chunks if c["choices"])
    assert isinstance(text, str)
    last = chunks[-1]
    assert last["choices"] == []  # the include_usage chunk
    check_timings(last["timings"], last["usage"])
    assert 1 <= last["usage"]["completion_tokens"] <= 8


def test_multi_turn_reuses_cache_via_checkpoints(server: LlamaServer, client: httpx.Client) -> None:
    """An 8-turn conversation re-sent each turn on slot 0: from turn 2 on, the prefix up to (at
    worst) the previous prompt's last checkpoint comes from the cache, never a full re-prefill."""
    log_start = len(server.log_text())
    messages: list[dict[str, Any]] = []
    previous_prompt = 0
    cache_ns: list[int] = []
    prompt_ns: list[int] = []
    for turn in range(1, 9):
        text = f"Turn {turn}: tell me one fact about the number {turn * 7} and about the sea."
        messages.append({"role": "user", "content": text})
        body = chat(client, messages, id_slot=0, cache_prompt=True, seed=turn)
        usage, timings = body["usage"], body["timings"]
        check_timings(timings, usage)
        cache_ns.append(timings["cache_n"])
        prompt_ns.append(usage["prompt_tokens"])
        if turn >= 2:
            assert timings["cache_n"] >= previous_prompt - CHECKPOINT_SLACK, (turn, previous_prompt, timings)
            assert timings["prompt_n"] < usage["prompt_tokens"] - previous_prompt + 2 * CHECKPOINT_SLACK
        previous_prompt = usage["prompt_tokens"]
        messages.append({"role": "assistant", "content": body["choices"][0]["message"]["content"]})

    # The same prompt again: nothing new to evaluate, so the server must roll the recurrent state
    # back to a checkpoint (it cannot truncate it) and re-process only the last few tokens.
    again = chat(client, messages[:-1], id_slot=0, cache_prompt=True, seed=8)
    assert again["usage"]["prompt_tokens"] == previous_prompt
    assert previous_prompt - CHECKPOINT_SLACK <= again["timings"]["cache_n"] < previous_prompt
    cache_ns.append(again["timings"]["cache_n"])
    print(f"\nprompt tokens per turn: {prompt_ns}; cache_n per turn (+ identical re-send): {cache_ns}")

    log = server.log_text()[log_start:]
    assert "created context checkpoint" in log
    assert "restored context checkpoint" in log
    assert "forcing full prompt re-processing" not in log


def test_factory_lifecycle(llama_server: LlamaServerFactory) -> None:
    """The factory's server uses the explicit arguments and stops cleanly on SIGTERM."""
    server = llama_server(ctx_total=2048, extra_args=["--cache-ram", "0"])
    assert server.startup_seconds is not None
    print(f"\nfactory server ready in {server.startup_seconds:.2f} s (saw 503: {server.saw_loading_503})")
    for flag in ("-np", "-t", "--metrics", "--slots", "--alias", "--cache-ram"):
        assert flag in server.args
    with httpx.Client(base_url=server.base_url, timeout=30.0) as client:
        assert client.get("/props").json()["default_generation_settings"]["n_ctx"] == 1024
    assert server.stop() == 0
    assert not server.running
    with pytest.raises(httpx.TransportError), httpx.Client(base_url=server.base_url, timeout=5.0) as client:
        client.get("/health")
