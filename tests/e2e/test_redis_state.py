"""The gateway on a real Redis (``state.url``): what it knows of sessions, slots and decisions outlives it."""

from __future__ import annotations

import asyncio
import itertools
import time
import uuid
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest
import structlog

from backends.sim import SimConfig
from gateway.app import create_app
from gateway.state.prefix_index import PrefixIndex
from gateway.state.redis_store import RedisStore
from gateway.state.resilient import ResilientStore
from policies import Architecture
from policies.features import extract
from policies.types import Endpoint
from tests.e2e.conftest import Stack, start_stack, stop_stack
from tests.latency_proxy import LatencyProxy
from tests.placement import assert_one_slot
from tests.redis_server import RedisServer
from tests.servers import ADMIN, ServerThread

LOOP = asyncio.new_event_loop()
SYSTEM = {"role": "system", "content": "You are a careful coding agent. " * 150}
PATIENCE_S = 30.0
"""How long a test waits for something that happens in the background (a replica's next sync, Redis
tried again): far above its period, so a busy machine does not fail the test."""


@pytest.fixture
def stack(redis_server: RedisServer) -> Iterator[Stack]:
    # engine times of tens of ms: learned rates (which decide placement) stand above a busy box's
    # jitter; a Redis reply slow on a busy box does not degrade a replica to its local state
    running = start_stack(
        vllm=SimConfig(kind="vllm", model="up-vllm", time_scale=0.02, architecture=Architecture.HYBRID),
        llama=SimConfig(kind="llamacpp", model="up-llama", time_scale=0.02, slots=2),
        state={"url": redis_server.url, "prefix": f"e2e{uuid.uuid4().hex[:6]}", "timeout_s": 5.0},
        groups=[{"name": "grp", "members": ["m-llama", "m-vllm"]}],
    )
    try:
        yield running
    finally:
        stop_stack(running)


def step(n: int) -> dict[str, str]:
    """The user's ``n``-th message."""
    return {"role": "user", "content": f"Step {n}: " + "look at the tests again. " * 60}


def turn(
    url: str, history: list[dict[str, str]], n: int, session: str | None = "restart-me"
) -> httpx.Response:
    history.append(step(n))
    response = httpx.post(
        url + "/v1/chat/completions",
        json={"model": "m-both", "messages": history, "max_tokens": 8},
        headers={"x-session-id": session} if session is not None else {},
        timeout=30,
    )
    assert response.status_code == 200, response.text
    history.append({"role": "assistant", "content": response.json()["choices"][0]["message"]["content"]})
    return response


def test_a_restarted_gateway_continues_the_session_on_its_slot(stack: Stack, tmp_path: Path) -> None:
    history: list[dict[str, str]] = [SYSTEM]
    for n in range(3):
        first = turn(stack.url, history, n)
    slot = first.headers["x-turnout-slot"]
    assert first.headers["x-turnout-backend"] == "llama"
    before = httpx.get(stack.url + "/admin/api/decisions", headers=ADMIN, timeout=30).json()["data"]
    stack.gateway.stop()
    restarted = ServerThread(create_app(stack.settings)).start()
    stack.servers[0] = restarted
    try:
        again = turn(restarted.url, history, 3)
        assert (again.headers["x-turnout-backend"], again.headers["x-turnout-slot"]) == ("llama", slot)
        after = httpx.get(restarted.url + "/admin/api/decisions", headers=ADMIN, timeout=30).json()["data"]
        assert len(after) == len(before) + 1  # the decision log lives in Redis
        usage = again.json()["usage"]
        assert usage["prompt_tokens_details"]["cached_tokens"] > 0.9 * after[1]["outcome"]["prompt_tokens"]
    finally:
        restarted.stop()


def test_turns_alternating_between_two_replicas_stay_on_one_slot(stack: Stack) -> None:
    """Two gateways on one Redis (behind a load balancer): one session, one slot, growing cache."""
    second = ServerThread(create_app(stack.settings)).start()
    try:
        history: list[dict[str, str]] = [SYSTEM]
        answers = []
        for n in range(6):
            url = (stack.url, second.url)[n % 2]
            answers.append(turn(url, history, n))
            finished(url, turns=n + 1)  # a turn is shared once its answer has ended
    finally:
        second.stop()
    assert_one_slot(answers)
    cached = [a.json()["usage"]["prompt_tokens_details"]["cached_tokens"] for a in answers]
    prompts = [a.json()["usage"]["prompt_tokens"] for a in answers]
    assert all(c >= 0.9 * p for c, p in zip(cached[1:], prompts, strict=False))  # each turn reused the last


def finished(url: str, turns: int) -> None:
    """Wait until the gateway at ``url`` stored a session's ``turns``-th turn (it does once the
    answer has ended, so a client can be faster than that)."""
    deadline = time.monotonic() + PATIENCE_S
    while time.monotonic() < deadline:
        sessions = httpx.get(url + "/admin/api/sessions", headers=ADMIN, timeout=30).json()["data"]
        if any(s["turns"] >= turns for s in sessions):
            return
        time.sleep(0.02)
    raise AssertionError(f"no session reached {turns} turns at {url}")


def test_a_conversation_without_session_ids_is_recognised_by_every_replica(stack: Stack) -> None:
    """No session id: each replica recognises the conversation by content, in the prefix index the
    replicas share (the other replica's records reach it through Redis): one session, six turns,
    each one placed knowing what the last one left where (where it goes depends on learned rates)."""
    second = ServerThread(create_app(stack.settings)).start()
    try:
        history: list[dict[str, str]] = [SYSTEM]
        answers = []
        for n in range(6):
            replicas = (stack.gateway, second)
            answers.append(turn(replicas[n % 2].url, history, n, session=None))
            finished(replicas[n % 2].url, turns=n + 1)  # the replica stored the turn, after the answer ended
            # an agent's think time: the record reaches the other replica meanwhile (through Redis)
            recognised(replicas[(n + 1) % 2], [*history, step(n + 1)])
    finally:
        second.stop()
    sessions = httpx.get(stack.url + "/admin/api/sessions", headers=ADMIN, timeout=30).json()["data"]
    assert [s["turns"] for s in sessions] == [6]  # not a new session at every change of replica
    assert {a.headers["x-turnout-session-source"] for a in answers} == {"implicit"}
    decisions = httpx.get(stack.url + "/admin/api/decisions", headers=ADMIN, timeout=30).json()["data"][::-1]
    after_llama = [
        next(c for c in now["candidates"] if c["backend"] == "llama")
        for before, now in itertools.pairwise(decisions)
        if before["chosen"] == "llama"
    ]
    assert after_llama  # some turn was on llama.cpp (its slot is the cheapest place to continue)
    assert all(c["expected_cached_tokens"] > 0 for c in after_llama)  # known, whichever replica sent it


def prefix_index(replica: ServerThread) -> PrefixIndex:
    """The replica's prefix index, in which it folds the other replicas' records."""
    store = replica._server.config.app.state.core.router.store
    assert isinstance(store, ResilientStore)
    return store.local.index


def recognised(replica: ServerThread, messages: list[dict[str, str]]) -> None:
    """Wait until ``replica`` knows the conversation whose next request sends ``messages`` (it
    folded the record of its last turn, which the other replica sent, into its prefix index)."""
    chain = extract({"model": "m-both", "messages": messages}, Endpoint.CHAT, model="m-both").chain
    deadline = time.monotonic() + PATIENCE_S
    while prefix_index(replica).find_session(chain) is None:
        if time.monotonic() > deadline:
            raise AssertionError(f"{replica.url} did not learn of the conversation's last turn")
        time.sleep(0.02)


def test_what_one_replica_learned_reaches_the_others(stack: Stack) -> None:
    """The second replica has served nothing, yet routes on the rates the first one measured."""
    second = ServerThread(create_app(stack.settings)).start()
    try:
        history: list[dict[str, str]] = [SYSTEM]
        for n in range(3):
            turn(stack.url, history, n)

        def learned(url: str) -> dict[str, int]:
            overview = httpx.get(url + "/admin/api/overview", headers=ADMIN, timeout=30).json()
            return {b["id"]: sum(m["samples"] for m in b["learned"]) for b in overview["backends"]}

        first = learned(stack.url)
        assert first["llama"] > 0
        deadline = time.monotonic() + PATIENCE_S  # both replicas share every 0.5 s
        while learned(second.url)["llama"] < first["llama"] and time.monotonic() < deadline:
            time.sleep(0.1)
        assert learned(second.url)["llama"] == first["llama"]
    finally:
        second.stop()


def test_redis_going_away_fails_no_request_and_its_return_gets_the_state_back(
    tmp_path: Path,
) -> None:
    server = RedisServer(tmp_path).start()
    running = start_stack(state={"url": server.url, "prefix": "down", "timeout_s": 5.0})
    try:
        history: list[dict[str, str]] = [SYSTEM]
        turn(running.url, history, 0)
        with structlog.testing.capture_logs() as logs:  # from before: a background sync may notice first
            server.stop()  # killed mid-conversation
            for n in range(1, 5):
                assert turn(running.url, history, n).headers["x-turnout-backend"] == "llama"
            health = httpx.get(running.url + "/health", timeout=30).json()
            decisions = httpx.get(running.url + "/admin/api/decisions", headers=ADMIN, timeout=30).json()[
                "data"
            ]
        assert health["state"] == "degraded"
        assert len(decisions) >= 4  # from the local copy
        assert [e["event"] for e in logs].count("state.degraded") == 1  # not one per request
        server.start()  # back, on the same port, empty
        turns = 5
        deadline = time.monotonic() + PATIENCE_S  # Redis is tried again once a second
        while True:
            turn(running.url, history, turns)
            turns += 1
            if httpx.get(running.url + "/health", timeout=30).json()["state"] == "ok":
                break
            if time.monotonic() > deadline:
                raise AssertionError("the gateway did not go back to Redis once it was there again")
            time.sleep(0.1)
        shared = RedisStore(server.url, prefix="down", timeout_s=5.0)
        try:
            deadline = time.monotonic() + PATIENCE_S  # the last turn is written once its answer ended
            while True:
                session = LOOP.run_until_complete(shared.get_session("h:restart-me"))
                if (session is not None and session.turns == turns) or time.monotonic() > deadline:
                    break
                time.sleep(0.02)
            assert session is not None
            assert session.turns == turns  # written back, then kept up to date
        finally:
            LOOP.run_until_complete(shared.close())
    finally:
        stop_stack(running)
        server.stop()


def test_a_slow_redis_costs_a_request_at_most_one_timeout(redis_server: RedisServer) -> None:
    """Redis answering a minute late: the gateway gives up on it after state.timeout_s, routes on
    local state (no request fails; Redis is tried again once a second, not on every call), reports
    degraded, and returns once Redis is fast: /health alone finds it back, without traffic. (That
    Redis is tried at most once per retry period is counted, on a fake clock, in
    tests/gateway/test_state_resilient.py.)"""
    timeout_s = 2.0  # far above what a busy machine adds to a turn, so one timeout is told from several
    proxy = LatencyProxy(redis_server.port).start()
    running = start_stack(
        state={
            "url": f"redis://127.0.0.1:{proxy.port}/0",
            "prefix": f"slow{uuid.uuid4().hex[:6]}",
            "timeout_s": timeout_s,
        }
    )
    try:
        history: list[dict[str, str]] = [SYSTEM]
        turn(running.url, history, 0)

        def timed(n: int) -> float:
            started = time.monotonic()
            assert turn(running.url, history, n).status_code == 200
            return time.monotonic() - started

        usual = max(timed(n) for n in range(1, 4))  # a turn on this machine now, Redis answering at once
        proxy.delay = 60.0
        took = [timed(n) for n in range(4, 7)]
        # a turn makes several Redis calls: trying Redis on each would cost it several timeouts
        assert max(took) < usual + 2 * timeout_s, f"turns waited {took} on a Redis that answers in 60 s"
        assert httpx.get(running.url + "/health", timeout=30).json()["state"] == "degraded"
        proxy.delay = 0.0
        deadline = time.monotonic() + PATIENCE_S
        while time.monotonic() < deadline:  # no traffic: /health itself asks Redis again
            if httpx.get(running.url + "/health", timeout=30).json()["state"] == "ok":
                break
            time.sleep(0.5)
        else:
            raise AssertionError("the gateway did not return to Redis once it was fast again")
        assert turn(running.url, history, 9).status_code == 200
    finally:
        stop_stack(running)
        proxy.stop()


def test_a_policy_change_reaches_every_replica(stack: Stack) -> None:
    """An admin's change on one replica is applied by the others (each polls the shared policy
    every POLICY_POLL_S)."""
    second = ServerThread(create_app(stack.settings)).start()
    try:
        switched = httpx.post(
            stack.url + "/admin/api/policy/profile",
            json={"profile": "prefer-vllm"},
            headers=ADMIN,
            timeout=30,
        )
        assert switched.status_code == 200
        drained = httpx.post(stack.url + "/admin/api/backends/llama/drain", headers=ADMIN, timeout=30)
        assert drained.status_code == 200
        pinned = httpx.post(
            stack.url + "/admin/api/groups/grp/pin", json={"member": "m-vllm"}, headers=ADMIN, timeout=30
        )
        assert pinned.status_code == 200
        deadline = time.monotonic() + PATIENCE_S
        while time.monotonic() < deadline:
            policy = httpx.get(second.url + "/admin/api/policy", headers=ADMIN, timeout=30).json()
            if (
                policy["profile"] == "prefer-vllm"
                and [b["id"] for b in policy["backends"] if b["drained"]] == ["llama"]
                and policy["groups"][0]["pinned"] == "m-vllm"
            ):
                break
            time.sleep(0.05)
        else:
            raise AssertionError(f"the second replica still follows {policy}")
        answer = httpx.post(
            second.url + "/v1/chat/completions",
            json={"model": "m-both", "messages": [{"role": "user", "content": "hi"}], "max_tokens": 2},
            timeout=30,
        )
        assert answer.headers["x-turnout-backend"] == "vllm"
        assert "llama: drained" in answer.headers["x-turnout-route-reason"]
    finally:
        second.stop()
