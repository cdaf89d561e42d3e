"""The gateway on a real Redis (``state.url``): what it knows of sessions, slots and decisions outlives it."""

from __future__ import annotations

import asyncio
import time
import uuid
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest
import structlog

from gateway.app import create_app
from gateway.state.redis_store import RedisStore
from tests.e2e.conftest import Stack, start_stack, stop_stack
from tests.redis_server import RedisServer
from tests.servers import ADMIN, ServerThread

LOOP = asyncio.new_event_loop()
SYSTEM = {"role": "system", "content": "You are a careful coding agent. " * 150}


@pytest.fixture(scope="module")
def redis_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[RedisServer]:
    server = RedisServer(tmp_path_factory.mktemp("redis")).start()
    try:
        yield server
    finally:
        server.stop()


@pytest.fixture
def stack(redis_server: RedisServer) -> Iterator[Stack]:
    running = start_stack(state={"url": redis_server.url, "prefix": f"e2e{uuid.uuid4().hex[:6]}"})
    try:
        yield running
    finally:
        stop_stack(running)


def turn(url: str, history: list[dict[str, str]], n: int) -> httpx.Response:
    history.append({"role": "user", "content": f"Step {n}: " + "look at the tests again. " * 60})
    response = httpx.post(
        url + "/v1/chat/completions",
        json={"model": "m-both", "messages": history, "max_tokens": 8},
        headers={"x-session-id": "restart-me"},
        timeout=30,
    )
    assert response.status_code == 200
    history.append({"role": "assistant", "content": response.json()["choices"][0]["message"]["content"]})
    return response


def test_a_restarted_gateway_continues_the_session_on_its_slot(stack: Stack, tmp_path: Path) -> None:
    history: list[dict[str, str]] = [SYSTEM]
    for n in range(3):
        first = turn(stack.url, history, n)
    slot = first.headers["x-turnout-slot"]
    assert first.headers["x-turnout-backend"] == "llama"
    before = httpx.get(stack.url + "/admin/api/decisions", headers=ADMIN).json()["data"]
    stack.gateway.stop()
    restarted = ServerThread(create_app(stack.settings)).start()
    stack.servers[0] = restarted
    try:
        again = turn(restarted.url, history, 3)
        assert (again.headers["x-turnout-backend"], again.headers["x-turnout-slot"]) == ("llama", slot)
        after = httpx.get(restarted.url + "/admin/api/decisions", headers=ADMIN).json()["data"]
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
        answers = [turn((stack.url, second.url)[n % 2], history, n) for n in range(6)]
    finally:
        second.stop()
    placed = {(a.headers["x-turnout-backend"], a.headers["x-turnout-slot"]) for a in answers}
    assert len(placed) == 1
    cached = [a.json()["usage"]["prompt_tokens_details"]["cached_tokens"] for a in answers]
    prompts = [a.json()["usage"]["prompt_tokens"] for a in answers]
    assert all(c >= 0.9 * p for c, p in zip(cached[1:], prompts, strict=False))  # each turn reused the last


def test_redis_going_away_fails_no_request_and_its_return_gets_the_state_back(
    tmp_path: Path,
) -> None:
    server = RedisServer(tmp_path).start()
    running = start_stack(state={"url": server.url, "prefix": "down"})
    try:
        history: list[dict[str, str]] = [SYSTEM]
        turn(running.url, history, 0)
        server.stop()  # killed mid-conversation
        with structlog.testing.capture_logs() as logs:
            for n in range(1, 5):
                assert turn(running.url, history, n).headers["x-turnout-backend"] == "llama"
            health = httpx.get(running.url + "/health").json()
            decisions = httpx.get(running.url + "/admin/api/decisions", headers=ADMIN).json()["data"]
        assert health["state"] == "degraded"
        assert len(decisions) >= 4  # from the local copy
        assert [e["event"] for e in logs].count("state.degraded") == 1  # not one per request
        server.start()  # back, on the same port, empty
        turn(running.url, history, 5)
        assert httpx.get(running.url + "/health").json()["state"] == "ok"
        shared = RedisStore(server.url, prefix="down")
        session = LOOP.run_until_complete(shared.get_session("h:restart-me"))
        assert session is not None
        assert session.turns == 6  # written back, then kept up to date
        LOOP.run_until_complete(shared.close())
    finally:
        stop_stack(running)
        server.stop()


def test_a_policy_change_reaches_every_replica_within_a_second(stack: Stack) -> None:
    second = ServerThread(create_app(stack.settings)).start()
    try:
        switched = httpx.post(
            stack.url + "/admin/api/policy/profile", json={"profile": "prefer-vllm"}, headers=ADMIN
        )
        assert switched.status_code == 200
        drained = httpx.post(stack.url + "/admin/api/backends/llama/drain", headers=ADMIN)
        assert drained.status_code == 200
        deadline = time.monotonic() + 1.0
        while time.monotonic() < deadline:
            policy = httpx.get(second.url + "/admin/api/policy", headers=ADMIN).json()
            if policy["profile"] == "prefer-vllm" and [
                b["id"] for b in policy["backends"] if b["drained"]
            ] == ["llama"]:
                break
            time.sleep(0.05)
        else:
            raise AssertionError(f"the second replica still follows {policy}")
        answer = httpx.post(
            second.url + "/v1/chat/completions",
            json={"model": "m-both", "messages": [{"role": "user", "content": "hi"}], "max_tokens": 2},
        )
        assert answer.headers["x-turnout-backend"] == "vllm"
        assert "llama: drained" in answer.headers["x-turnout-route-reason"]
    finally:
        second.stop()
