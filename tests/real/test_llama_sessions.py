"""Sessions on a real llama-server through turnout: slot pinning keeps reuse; eviction is predicted.

The server has 2 slots of 2048 tokens. Reuse on this hybrid (qwen35) model comes from the live
recurrent state or from a context checkpoint taken a few tokens before each prompt's end.
"""

from __future__ import annotations

import itertools
from collections.abc import Iterator
from typing import Any

import httpx
import pytest

from gateway.app import create_app
from gateway.settings import load_settings
from policies.sessions import session_label
from tests.real.llama_server import DEFAULT_ALIAS, LlamaServer, LlamaServerFactory
from tests.servers import ADMIN, ServerThread

pytestmark = [pytest.mark.real_llama, pytest.mark.timeout(300)]

MODEL = "tiny"
CHECKPOINT_SLACK = 4  # a checkpoint sits 4 tokens before each prompt end


def gateway_for(server: LlamaServer) -> ServerThread:
    settings = load_settings(
        None,
        backends=[
            {
                "id": "llama",
                "kind": "llamacpp",
                "url": server.base_url,
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
    return ServerThread(create_app(settings)).start()


@pytest.fixture(scope="module")
def pinned(llama_server_module: LlamaServerFactory) -> Iterator[tuple[LlamaServer, ServerThread]]:
    server = llama_server_module(n_parallel=2, ctx_total=4096)
    gateway = gateway_for(server)
    try:
        yield server, gateway
    finally:
        gateway.stop()


@pytest.fixture(scope="module")
def no_ram_cache(llama_server_module: LlamaServerFactory) -> Iterator[tuple[LlamaServer, ServerThread]]:
    server = llama_server_module(n_parallel=2, ctx_total=4096, extra_args=["--cache-ram", "0"])
    gateway = gateway_for(server)
    try:
        yield server, gateway
    finally:
        gateway.stop()


class Conversation:
    def __init__(self, gateway: ServerThread, session: str, topic: str) -> None:
        self.gateway = gateway
        self.session = session
        self.messages: list[dict[str, Any]] = [
            {"role": "system", "content": f"You answer questions about {topic}."}
        ]
        self.turns: list[dict[str, Any]] = []

    def turn(self, text: str) -> dict[str, Any]:
        self.messages.append({"role": "user", "content": text})
        body = {"model": MODEL, "messages": self.messages, "max_tokens": 6}
        response = httpx.post(
            self.gateway.url + "/v1/chat/completions",
            json=body,
            headers={"x-session-id": self.session},
            timeout=120,
        )
        assert response.status_code == 200, response.text
        data: dict[str, Any] = response.json()
        data["_slot"] = response.headers.get("x-turnout-slot")
        data["_reason"] = response.headers["x-turnout-route-reason"]
        self.messages.append({"role": "assistant", "content": data["choices"][0]["message"]["content"] or ""})
        self.turns.append(data)
        return data


def latest_decisions(gateway: ServerThread, count: int) -> list[dict[str, Any]]:
    data: list[dict[str, Any]] = httpx.get(
        gateway.url + "/admin/api/decisions", headers=ADMIN, params={"limit": count}
    ).json()["data"]
    return list(reversed(data))


def test_eight_turn_session_stays_on_its_slot(pinned: tuple[LlamaServer, ServerThread]) -> None:
    _, gateway = pinned
    conversation = Conversation(gateway, "eight", "routers")
    for turn in range(8):
        conversation.turn(f"Question {turn}: how does turn {turn} differ from the last one?")
    turns = conversation.turns
    assert len({t["_slot"] for t in turns}) == 1
    for previous, current in itertools.pairwise(turns):
        assert current["timings"]["cache_n"] >= previous["usage"]["prompt_tokens"] - CHECKPOINT_SLACK
    assert "warm slot" in turns[-1]["_reason"]


@pytest.fixture
def fresh(llama_server: LlamaServerFactory) -> Iterator[ServerThread]:
    gateway = gateway_for(llama_server(n_parallel=2, ctx_total=4096))
    try:
        yield gateway
    finally:
        gateway.stop()


def test_two_interleaved_sessions_keep_their_reuse(fresh: ServerThread) -> None:
    """Two sessions on two free slots each keep their own (no save/restore round trips)."""
    gateway = fresh
    a = Conversation(gateway, "alpha", "gardens")
    b = Conversation(gateway, "beta", "ships")
    for turn in range(4):
        a.turn(f"Alpha question {turn}?")
        b.turn(f"Beta question {turn}?")
    assert {t["_slot"] for t in a.turns} != {t["_slot"] for t in b.turns}
    for conversation in (a, b):
        for previous, current in itertools.pairwise(conversation.turns):
            assert current["timings"]["cache_n"] >= previous["usage"]["prompt_tokens"] - CHECKPOINT_SLACK
    decisions = latest_decisions(gateway, 8)
    reported = [t["timings"]["cache_n"] for pair in zip(a.turns, b.turns, strict=True) for t in pair]
    assert [d["outcome"]["cached_tokens"] for d in decisions] == reported


def evicted_by(gateway: ServerThread) -> str | None:
    """The label of the session the newest decision took a slot from."""
    chosen = latest_decisions(gateway, 1)[0]["candidates"][0]
    evicts: str | None = chosen.get("evicts")
    return evicts


def test_evicted_session_restores_from_the_ram_cache(fresh: ServerThread) -> None:
    """Three sessions on two slots, RAM cache on (the default): the session that lost its slot gets
    its conversation back from RAM, and turnout predicted that instead of a full re-prefill."""
    gateway = fresh
    talks = {
        name: Conversation(gateway, f"ram-{name}", topic) for name, topic in [("a", "ants"), ("b", "bees")]
    }
    for name in ("a", "a", "b"):
        talks[name].turn(f"A question for {name}?")
    c = Conversation(gateway, "ram-c", "cats")
    c.turn("First about cats?")
    victim = next(n for n, t in talks.items() if evicted_by(gateway) == session_label(f"h:{t.session}"))
    talks[victim].turn("Back again?")
    decision = latest_decisions(gateway, 1)[0]
    llama = decision["candidates"][0]
    assert "restore from the RAM cache" in llama["note"]
    assert llama["cache_source"] == "ram"
    previous = talks[victim].turns[-2]["usage"]["prompt_tokens"]
    assert talks[victim].turns[-1]["timings"]["cache_n"] >= previous - CHECKPOINT_SLACK
    assert llama["expected_cached_tokens"] >= 0.9 * (previous - CHECKPOINT_SLACK)


def test_evicted_session_re_prefills_as_learned(no_ram_cache: tuple[LlamaServer, ServerThread]) -> None:
    """Without a RAM cache (--cache-ram 0) the first lost slot shows turnout the server keeps nothing;
    from then on a session that lost its slot is predicted to re-prefill in full, and does."""
    _, gateway = no_ram_cache
    talks = {
        name: Conversation(gateway, f"cold-{name}", topic)
        for name, topic in [("a", "apples"), ("b", "bridges"), ("c", "clouds"), ("d", "dunes")]
    }

    def lose_a_slot(newcomer: str, holders: tuple[str, ...]) -> str:
        talks[newcomer].turn(f"First about {newcomer}?")
        label = evicted_by(gateway)
        return next(name for name in holders if session_label(f"h:{talks[name].session}") == label)

    for name in ("a", "a", "b"):
        talks[name].turn(f"About {name}?")
    first = lose_a_slot("c", ("a", "b"))
    talks[first].turn("Again?")  # predicted from the RAM cache (the default), finds nothing: learned
    assert talks[first].turns[-1]["timings"]["cache_n"] == 0
    holders = ("a", "b", "c")
    second = lose_a_slot("d", holders)
    talks[second].turn("And again?")
    llama = latest_decisions(gateway, 1)[0]["candidates"][0]
    assert "session's slot was lost: full re-prefill" in llama["note"]
    assert llama["expected_cached_tokens"] < 0.1 * talks[second].turns[-2]["usage"]["prompt_tokens"]
    assert talks[second].turns[-1]["timings"]["cache_n"] == 0
