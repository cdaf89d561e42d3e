"""Contract: turnout's llama.cpp simulator answers like the real llama-server, by shape.

The same requests go to a real llama-server (tiny random qwen35, 2 slots of 2048 tokens) and to
the simulator configured alike; JSON keys and types, SSE event sequences, metric names and error
shapes must match. Values (text, timings) are the engines' own.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from typing import Any

import httpx
import pytest

from backends.parsers.prometheus import parse_samples
from backends.sim import SimConfig, create_sim_app
from tests.real.llama_server import (
    CLIENT_LIMITS,
    DEFAULT_ALIAS,
    LlamaServer,
    LlamaServerFactory,
    twin_sim_config,
)
from tests.real.shapes import chat_event_kinds, differences, shape, sse_payloads
from tests.servers import serve

pytestmark = [pytest.mark.real_llama, pytest.mark.timeout(300)]

SLOT_CTX = 2048
MESSAGES = [{"role": "user", "content": "Say something about routers."}]


@pytest.fixture(scope="module")
def pair(llama_server_module: LlamaServerFactory) -> Iterator[tuple[httpx.Client, httpx.Client]]:
    real: LlamaServer = llama_server_module(n_parallel=2, ctx_total=2 * SLOT_CTX)
    config = twin_sim_config(SLOT_CTX)
    with (
        serve(create_sim_app(config)) as sim,
        httpx.Client(base_url=real.base_url, timeout=120, limits=CLIENT_LIMITS) as real_client,
        httpx.Client(base_url=sim.url, timeout=30) as sim_client,
    ):
        yield real_client, sim_client


def both(
    pair: tuple[httpx.Client, httpx.Client], method: str, path: str, **kwargs: Any
) -> list[httpx.Response]:
    return [client.request(method, path, **kwargs) for client in pair]


def assert_same_shape(real: Any, sim: Any) -> None:
    found = differences(shape(real), shape(sim))
    assert not found, "\n".join(found)


@pytest.mark.parametrize("path", ["/health", "/v1/models", "/props"])
def test_info_endpoints(pair: tuple[httpx.Client, httpx.Client], path: str) -> None:
    real, sim = both(pair, "GET", path)
    assert real.status_code == sim.status_code == 200
    real_json, sim_json = real.json(), sim.json()
    if path == "/props":  # the real /props carries template and build details the simulator has no use for
        real_json = {k: real_json[k] for k in ("default_generation_settings", "total_slots", "model_alias")}
        sim_json = {k: sim_json[k] for k in real_json}
        real_json["default_generation_settings"] = {
            "n_ctx": real_json["default_generation_settings"]["n_ctx"]
        }
        sim_json["default_generation_settings"] = {"n_ctx": sim_json["default_generation_settings"]["n_ctx"]}
        assert real_json == sim_json
    assert_same_shape(real_json, sim_json)


def test_input_tokens(pair: tuple[httpx.Client, httpx.Client]) -> None:
    """``/v1/chat/completions/input_tokens`` counts the templated prompt without running it."""
    body = {"model": DEFAULT_ALIAS, "messages": MESSAGES}
    real, sim = both(pair, "POST", "/v1/chat/completions/input_tokens", json=body)
    assert real.status_code == sim.status_code == 200
    assert_same_shape(real.json(), sim.json())
    completion = pair[0].post("/v1/chat/completions", json={**body, "max_tokens": 1}).json()
    assert real.json()["input_tokens"] == completion["usage"]["prompt_tokens"]


def test_slots(pair: tuple[httpx.Client, httpx.Client]) -> None:
    """A slot that never ran a task shows four keys; one that did adds its task's fields."""
    both(
        pair,
        "POST",
        "/v1/chat/completions",
        json={"model": DEFAULT_ALIAS, "messages": MESSAGES, "max_tokens": 3},
    )
    real, sim = (response.json() for response in both(pair, "GET", "/slots"))
    assert [(s["id"], s["n_ctx"]) for s in real] == [(s["id"], s["n_ctx"]) for s in sim]
    for used in (True, False):
        real_slot = next(s for s in real if ("id_task" in s) == used)
        sim_slot = next(s for s in sim if ("id_task" in s) == used)
        assert_same_shape(real_slot, sim_slot)


def test_metric_names(pair: tuple[httpx.Client, httpx.Client]) -> None:
    real, sim = both(pair, "GET", "/metrics")
    real_names = {s.name for s in parse_samples(real.text)}
    sim_names = {s.name for s in parse_samples(sim.text)}
    assert real_names - sim_names == set()
    assert real.headers["content-type"].split(";")[0] == sim.headers["content-type"].split(";")[0]


@pytest.mark.parametrize("path", ["/v1/chat/completions", "/v1/completions"])
def test_non_stream(pair: tuple[httpx.Client, httpx.Client], path: str) -> None:
    body: dict[str, Any] = {
        "model": DEFAULT_ALIAS,
        "max_tokens": 6,
        "temperature": 0,
    }  # greedy: same text each run
    body |= {"messages": MESSAGES} if "chat" in path else {"prompt": "Once upon a time"}
    real, sim = both(pair, "POST", path, json=body)
    assert real.status_code == sim.status_code == 200
    assert_same_shape(real.json(), sim.json())


@pytest.mark.parametrize("include_usage", [False, True])
@pytest.mark.parametrize("path", ["/v1/chat/completions", "/v1/completions"])
def test_stream(pair: tuple[httpx.Client, httpx.Client], path: str, include_usage: bool) -> None:
    body: dict[str, Any] = {"model": DEFAULT_ALIAS, "max_tokens": 6, "stream": True, "temperature": 0}
    body |= {"messages": MESSAGES} if "chat" in path else {"prompt": "Once upon a time"}
    if include_usage:
        body["stream_options"] = {"include_usage": True}
    real, sim = both(pair, "POST", path, json=body)
    assert real.status_code == sim.status_code == 200
    if "chat" in path:
        assert chat_event_kinds(real.content) == chat_event_kinds(sim.content)
    real_events = [json.loads(p) for p in sse_payloads(real.content) if p != "[DONE]"]
    sim_events = [json.loads(p) for p in sse_payloads(sim.content) if p != "[DONE]"]
    assert (sse_payloads(real.content)[-1] == "[DONE]") == (sse_payloads(sim.content)[-1] == "[DONE]")
    for index in (0, 1, -2, -1):  # first, a middle delta, and the closing events
        assert_same_shape(real_events[index], sim_events[index])


@pytest.mark.parametrize(
    ("method", "path", "kwargs"),
    [
        (
            "POST",
            "/v1/chat/completions",
            {"content": b"{not json", "headers": {"content-type": "application/json"}},
        ),
        ("GET", "/v1/nothing", {}),
        (
            "POST",
            "/v1/chat/completions",
            {"json": {"model": DEFAULT_ALIAS, "messages": [{"role": "user", "content": "route " * 3000}]}},
        ),
    ],
    ids=["bad-json", "unknown-path", "context-exceeded"],
)
def test_errors(
    pair: tuple[httpx.Client, httpx.Client], method: str, path: str, kwargs: dict[str, Any]
) -> None:
    real, sim = both(pair, method, path, **kwargs)
    assert real.status_code == sim.status_code, (real.text, sim.text)
    assert_same_shape(real.json(), sim.json())
    assert real.json()["error"]["type"] == sim.json()["error"]["type"]


def test_auth_error(llama_server_module: LlamaServerFactory) -> None:
    """With ``--api-key``: 401 with the same JSON on /v1 paths, and /health stays open."""
    real = llama_server_module(n_parallel=1, ctx_total=1024, extra_args=["--api-key", "secret"])
    config = SimConfig(kind="llamacpp", model=DEFAULT_ALIAS, context_window=1024, slots=1, api_key="secret")
    with serve(create_sim_app(config)) as sim:
        for base in (real.base_url, sim.url):
            assert httpx.get(base + "/health").status_code == 200
        body = {"model": DEFAULT_ALIAS, "messages": MESSAGES, "max_tokens": 2}
        real_401, sim_401 = (
            httpx.post(base + "/v1/chat/completions", json=body) for base in (real.base_url, sim.url)
        )
        assert real_401.status_code == sim_401.status_code == 401
        assert real_401.json() == sim_401.json()
        keyed = {"authorization": "Bearer secret"}
        for base in (real.base_url, sim.url):
            assert (
                httpx.post(base + "/v1/chat/completions", json=body, headers=keyed, timeout=60).status_code
                == 200
            )
