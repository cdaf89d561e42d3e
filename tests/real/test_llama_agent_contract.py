"""Contract: the llama.cpp simulator's Anthropic Messages and OpenAI Responses endpoints answer like the
real llama-server, by shape: bodies, SSE event-name sequences, error shapes, and whether ``id_slot``
reaches the task on each endpoint.

Finding (real server, this tree): ``/v1/messages`` ignores ``id_slot`` and ``cache_prompt`` (the
Anthropic conversion builds a fresh body), ``/v1/responses`` honours both (its conversion copies the body).
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import httpx
import pytest

from backends.sim import create_sim_app
from tests.real.llama_server import (
    CLIENT_LIMITS,
    DEFAULT_ALIAS,
    LlamaServer,
    LlamaServerFactory,
    twin_sim_config,
)
from tests.real.shapes import collapsed, differences, named_events, shape
from tests.servers import serve

pytestmark = [pytest.mark.real_llama, pytest.mark.timeout(300)]

SLOT_CTX = 2048
MESSAGES = [{"role": "user", "content": "Say something about routers."}]
Pair = tuple[httpx.Client, httpx.Client]


@pytest.fixture(scope="module")
def pair(llama_server_module: LlamaServerFactory) -> Iterator[Pair]:
    real: LlamaServer = llama_server_module(n_parallel=2, ctx_total=2 * SLOT_CTX)
    config = twin_sim_config(SLOT_CTX)
    with (
        serve(create_sim_app(config)) as sim,
        httpx.Client(base_url=real.base_url, timeout=120, limits=CLIENT_LIMITS) as real_client,
        httpx.Client(base_url=sim.url, timeout=30) as sim_client,
    ):
        yield real_client, sim_client


def both(pair: Pair, path: str, body: Any) -> list[httpx.Response]:
    return [client.post(path, json=body) for client in pair]


def assert_same_shape(real: Any, sim: Any) -> None:
    found = differences(shape(real), shape(sim))
    assert not found, "\n".join(found)


# Greedy decoding: a random-weight model sampled at temperature 0.8 sometimes streams text that the
# server's output parser re-reads (a restarted or role-less stream), which would make runs differ.
MESSAGES_BODY = {
    "model": DEFAULT_ALIAS, "max_tokens": 6, "messages": MESSAGES, "system": "Be brief.", "temperature": 0
}  # fmt: skip
RESPONSES_BODY = {
    "model": DEFAULT_ALIAS, "max_output_tokens": 6, "input": "Say something about routers.", "temperature": 0
}  # fmt: skip


@pytest.mark.parametrize(
    ("path", "body"), [("/v1/messages", MESSAGES_BODY), ("/v1/responses", RESPONSES_BODY)]
)
def test_non_stream(pair: Pair, path: str, body: dict[str, Any]) -> None:
    real, sim = both(pair, path, body)
    assert real.status_code == sim.status_code == 200
    assert_same_shape(real.json(), sim.json())


@pytest.mark.parametrize(
    ("path", "body"), [("/v1/messages", MESSAGES_BODY), ("/v1/responses", RESPONSES_BODY)]
)
def test_stream(pair: Pair, path: str, body: dict[str, Any]) -> None:
    real, sim = both(pair, path, body | {"stream": True})
    assert real.status_code == sim.status_code == 200
    assert real.headers["content-type"].split(";")[0] == sim.headers["content-type"].split(";")[0]
    real_events, sim_events = named_events(real.content), named_events(sim.content)
    assert collapsed([n for n, _ in real_events]) == collapsed([n for n, _ in sim_events])
    assert b"[DONE]" not in real.content
    assert b"[DONE]" not in sim.content
    for (real_name, real_data), (sim_name, sim_data) in zip(real_events, sim_events, strict=False):
        if real_name == sim_name and not real_name.endswith("delta"):
            assert_same_shape(real_data, sim_data)
    assert_same_shape(real_events[-1][1], sim_events[-1][1])


@pytest.mark.parametrize(
    ("path", "body"),
    [
        ("/v1/messages/count_tokens", {"model": DEFAULT_ALIAS, "messages": MESSAGES}),
        ("/v1/responses/input_tokens", {"model": DEFAULT_ALIAS, "input": "Say something about routers."}),
    ],
)
def test_count_tokens(pair: Pair, path: str, body: dict[str, Any]) -> None:
    real, sim = both(pair, path, body)
    assert real.status_code == sim.status_code == 200
    assert real.json().keys() == sim.json().keys()


@pytest.mark.parametrize(
    ("path", "body"),
    [
        ("/v1/messages", {"model": DEFAULT_ALIAS, "max_tokens": 2}),
        ("/v1/responses", {"model": DEFAULT_ALIAS}),
        ("/v1/responses", {"input": "x", "previous_response_id": "resp_1"}),
        ("/v1/responses", {"input": 5}),
        ("/v1/messages", {"max_tokens": 2, "messages": [{"role": "user", "content": "route " * 3000}]}),
    ],
    ids=["messages-missing", "input-missing", "previous-response-id", "input-type", "context-exceeded"],
)
def test_errors(pair: Pair, path: str, body: dict[str, Any]) -> None:
    real, sim = both(pair, path, body)
    assert real.status_code == sim.status_code, (real.text, sim.text)
    assert_same_shape(real.json(), sim.json())
    assert real.json()["error"]["type"] == sim.json()["error"]["type"]
    if "previous_response_id" in body or ("input" not in body and path.endswith("responses")):
        assert real.json()["error"]["message"] == sim.json()["error"]["message"]


def last_slot(client: httpx.Client) -> int:
    """The slot that ran the most recent task."""
    slots = client.get("/slots").json()
    return int(max(slots, key=lambda s: s.get("id_task", -1))["id"])


def honours_id_slot(client: httpx.Client, path: str) -> bool:
    landed = []
    for n, slot in enumerate((0, 1, 0, 1)):
        text = f"pin {path} {n} " * 3
        body: dict[str, Any] = {"id_slot": slot}
        if path == "/v1/messages":
            body |= {"max_tokens": 2, "messages": [{"role": "user", "content": text}]}
        elif path == "/v1/responses":
            body |= {"max_output_tokens": 2, "input": text}
        else:
            body |= {"max_tokens": 2, "messages": [{"role": "user", "content": text}]}
        assert client.post(path, json=body).status_code == 200
        landed.append(last_slot(client))
    return landed == [0, 1, 0, 1]


@pytest.mark.parametrize(
    ("path", "honoured"),
    [("/v1/chat/completions", True), ("/v1/responses", True), ("/v1/messages", False)],
)
def test_id_slot(pair: Pair, path: str, honoured: bool) -> None:
    real, sim = (honours_id_slot(client, path) for client in pair)
    assert real is honoured
    assert sim is honoured
