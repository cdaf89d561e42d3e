"""Per-key limits: one contract run against both counters (in memory, and in a real Redis), what
replicas sharing a Redis see, and a Redis that goes away."""

from __future__ import annotations

import asyncio
import uuid
from collections.abc import Callable, Coroutine, Iterator
from pathlib import Path
from typing import Any

import pytest
import redis.asyncio as redis
import structlog

from gateway.access import Access, Key, RateLimited
from gateway.errors import ModelNotFound
from gateway.key_limits import MAX_REQUEST_S, Counter, KeyUsage, Limit, MemoryCounter, Quota, Refusal
from gateway.key_limits.redis_counter import RedisCounter
from gateway.key_limits.resilient import RETRY_EVERY_S, ResilientCounter
from policies.types import Usage
from tests.redis_server import RedisServer


class Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


LOOP = asyncio.new_event_loop()
"""One loop for the module: a Redis client belongs to the loop it was made in."""
REDIS_TIMEOUT_S = 5.0
"""The Redis counters' call timeout here: a reply slow on a busy machine is no failure (the default,
0.25 s, is for a gateway, which counts locally meanwhile)."""


def run(coroutine: Coroutine[Any, Any, Any]) -> Any:
    return LOOP.run_until_complete(coroutine)


Make = Callable[[Clock], Counter]
"""A counter on the clock given; on Redis, every counter one test makes shares one namespace."""


@pytest.fixture(params=["memory", "redis"])
def make(request: pytest.FixtureRequest) -> Iterator[Make]:
    made: list[Counter] = []
    prefix = f"t{uuid.uuid4().hex[:8]}"

    def counter(clock: Clock) -> Counter:
        if request.param == "memory":
            return MemoryCounter(clock)
        server: RedisServer = request.getfixturevalue("redis_server")
        made.append(RedisCounter(server.url, prefix=prefix, clock=clock, timeout_s=REDIS_TIMEOUT_S))
        return made[-1]

    yield counter
    for counter in made:
        run(counter.close())


def new_id() -> str:
    return uuid.uuid4().hex


def admit(counter: Counter, quota: Quota, key: str = "alice") -> tuple[str, Refusal | None]:
    request_id = new_id()
    return request_id, run(counter.admit(key, quota, request_id))


def usage_of(counter: Counter, key: str = "alice") -> KeyUsage:
    usage: KeyUsage = run(counter.usage([key]))[key]
    return usage


class TestContract:
    """The same behaviour from both counters."""

    def test_requests_per_minute_slide_and_say_when_the_next_passes(self, make: Make) -> None:
        clock = Clock()
        counter, quota = make(clock), Quota(requests_per_minute=3)
        for _ in range(3):
            assert admit(counter, quota)[1] is None
            clock.now += 10
        assert admit(counter, quota)[1] == Refusal(Limit.REQUESTS_PER_MINUTE, pytest.approx(30.0))
        clock.now = 1060.0  # the first leaves the window
        assert admit(counter, quota)[1] is None
        assert admit(counter, quota)[1] == Refusal(Limit.REQUESTS_PER_MINUTE, pytest.approx(10.0))

    def test_concurrent_requests_until_one_ends(self, make: Make) -> None:
        counter, quota = make(Clock()), Quota(concurrent=2)
        first, _ = admit(counter, quota)
        admit(counter, quota)
        assert admit(counter, quota)[1] == Refusal(Limit.CONCURRENT, 1.0)
        run(counter.release("alice", first, None))
        assert admit(counter, quota)[1] is None
        assert usage_of(counter).running == 2

    def test_tokens_per_minute_wait_until_enough_have_left_the_window(self, make: Make) -> None:
        clock = Clock()
        counter, quota = make(clock), Quota(tokens_per_minute=80)
        for at, spent in ((1000.0, 30), (1010.0, 40), (1020.0, 50)):
            clock.now = at
            request_id, refused = admit(counter, quota)
            assert refused is None
            run(counter.release("alice", request_id, Usage(spent - 5, 5)))
        clock.now = 1030.0  # 120 used; below 80 once the first two (70) have left, at 1070
        assert admit(counter, quota)[1] == Refusal(Limit.TOKENS_PER_MINUTE, pytest.approx(40.0))
        clock.now = 1070.0
        assert admit(counter, quota)[1] is None

    def test_a_running_entry_older_than_the_lifetime_is_dropped(self, make: Make) -> None:
        clock = Clock()
        counter, quota = make(clock), Quota(concurrent=1)
        admit(counter, quota)  # never released: its replica died
        clock.now += MAX_REQUEST_S - 1
        assert admit(counter, quota)[1] == Refusal(Limit.CONCURRENT, 1.0)
        clock.now += 2
        assert admit(counter, quota)[1] is None

    def test_usage_totals_and_the_last_minute(self, make: Make) -> None:
        clock = Clock()
        counter, quota = make(clock), Quota()
        ended, _ = admit(counter, quota)
        failed, _ = admit(counter, quota)
        admit(counter, quota)  # still running
        admit(counter, quota, key="bob")
        clock.now += 5
        run(counter.release("alice", ended, Usage(100, 20, cached_tokens=80)))
        run(counter.release("alice", failed, None))  # ended before the engine answered
        expected = KeyUsage(
            running=1,
            last_minute_requests=3,
            last_minute_tokens=120,
            requests=2,
            prompt_tokens=100,
            cached_tokens=80,
            completion_tokens=20,
        )
        assert run(counter.usage(["alice", "carol"])) == {"alice": expected, "carol": KeyUsage()}
        clock.now += 60
        later = usage_of(counter)
        assert (later.last_minute_requests, later.last_minute_tokens, later.requests) == (0, 0, 2)

    def test_releasing_a_request_it_did_not_admit_is_harmless(self, make: Make) -> None:
        counter = make(Clock())
        admit(counter, Quota())
        run(counter.release("alice", new_id(), Usage(3, 4)))
        used = usage_of(counter)
        assert (used.running, used.requests, used.last_minute_tokens) == (1, 1, 7)

    def test_racing_requests_never_exceed_the_limit(self, make: Make) -> None:
        counters, quota = [make(Clock()), make(Clock())], Quota(concurrent=3, requests_per_minute=5)
        if isinstance(counters[0], MemoryCounter):
            counters = counters[:1]  # a process's memory is not shared

        async def race() -> list[Refusal | None]:
            calls = [counters[n % len(counters)].admit("alice", quota, new_id()) for n in range(20)]
            return await asyncio.gather(*calls)

        assert sum(refusal is None for refusal in run(race())) == 3


class TestSharedByReplicas:
    """Two counters on one Redis are two gateway replicas."""

    def test_replicas_share_a_keys_requests_per_minute(self, redis_server: RedisServer) -> None:
        prefix, clock = f"r{uuid.uuid4().hex[:8]}", Clock()
        a, b = (
            RedisCounter(redis_server.url, prefix=prefix, clock=clock, timeout_s=REDIS_TIMEOUT_S)
            for _ in range(2)
        )
        quota = Quota(requests_per_minute=3)
        try:
            assert [admit(c, quota)[1] for c in (a, a, b)] == [None, None, None]
            assert admit(a, quota)[1] is not None
            assert admit(b, quota)[1] is not None
            assert usage_of(b).last_minute_requests == 3
        finally:
            run(a.close())
            run(b.close())

    def test_idle_keys_expire_but_usage_totals_stay(self, redis_server: RedisServer) -> None:
        prefix = f"x{uuid.uuid4().hex[:8]}"
        counter = RedisCounter(redis_server.url, prefix=prefix, timeout_s=REDIS_TIMEOUT_S)
        client = redis.Redis.from_url(redis_server.url)

        async def ttls() -> dict[str, int]:
            request_id = new_id()
            await counter.admit("alice", Quota(concurrent=2), request_id)
            await counter.release("alice", new_id(), Usage(1, 1))  # another request's tokens
            kinds = ("requests", "tokens", "running", "usage")
            return {kind: await client.pttl(f"{prefix}:v1:key:alice:{kind}") for kind in kinds}

        try:
            ttl = run(ttls())
        finally:
            run(counter.close())
            run(client.aclose())
        assert 0 < ttl["requests"] <= 60_000
        assert 0 < ttl["tokens"] <= 60_000
        assert 60_000 < ttl["running"] <= MAX_REQUEST_S * 1000
        assert ttl["usage"] == -1  # no expiry


class TestRedisAway:
    def test_requests_are_counted_locally_and_the_totals_written_back(self, tmp_path: Path) -> None:
        server = RedisServer(tmp_path).start()
        clock = Clock()
        shared = RedisCounter(
            server.url, prefix="away", timeout_s=REDIS_TIMEOUT_S
        )  # refused at once while away
        counter = ResilientCounter(shared, MemoryCounter(clock), clock)
        quota = Quota(requests_per_minute=2)
        try:
            before, _ = admit(counter, quota)  # admitted in Redis, ends while it is away
            server.stop()
            with structlog.testing.capture_logs() as logs:
                run(counter.release("alice", before, Usage(10, 2)))
                assert admit(counter, quota)[1] is None  # counted here now
                assert admit(counter, quota)[1] is None
                assert admit(counter, quota)[1] is not None  # and limited here
                assert usage_of(counter).requests == 1  # this replica's own, meanwhile
            assert counter.degraded
            assert [e["event"] for e in logs].count("limits.degraded") == 1  # not one per call
            server.start()  # back, on the same port, empty
            run(counter.retry())  # what /health does: not yet, the retry period has not passed
            assert counter.degraded
            clock.now += RETRY_EVERY_S
            run(counter.retry())  # no request needed to find it back
            assert not counter.degraded
            assert admit(counter, quota)[1] is None  # Redis's window is empty
            shared = usage_of(counter)
            assert (shared.requests, shared.prompt_tokens, shared.running) == (1, 10, 1)  # written back
        finally:
            run(counter.close())
            server.stop()

    def test_no_redis_at_all_fails_no_admission(self, tmp_path: Path) -> None:
        server = RedisServer(tmp_path)  # never started: nothing listens on its port
        access = Access([Key("alice", "0" * 64, concurrent=1)], ResilientCounter(
            RedisCounter(server.url), MemoryCounter()
        ))  # fmt: skip
        key = next(iter(access.keys.values()))
        ticket = run(access.admit(key, "m"))
        with pytest.raises(RateLimited):
            run(access.admit(key, "m"))
        run(access.release(ticket, None))
        assert run(access.usage())[0]["requests"] == 1
        run(access.close())


class TestAccess:
    def test_a_refusal_is_the_apis_429_with_retry_after(self) -> None:
        clock = Clock()
        key = Key("alice", "0" * 64, frozenset({"m"}), requests_per_minute=1)
        access = Access([key], MemoryCounter(clock))
        run(access.admit(key, "m"))
        clock.now += 20.5
        with pytest.raises(RateLimited) as limited:
            run(access.admit(key, "m"))
        assert limited.value.headers == {"retry-after": "40"}
        assert limited.value.message == "Key 'alice': 1 requests per minute at most."
        with pytest.raises(ModelNotFound):
            run(access.admit(key, "other"))

    def test_usage_lists_every_key_by_name_with_its_limits(self) -> None:
        access = Access([Key("alice", "0" * 64, tokens_per_minute=10), Key("bob", "1" * 64)])
        run(access.release(run(access.admit(access.keys["1" * 64], "m")), Usage(3, 4, cached_tokens=2)))
        bob = run(access.usage())[1]
        assert bob == {
            "name": "bob",
            "models": None,
            "limits": {"requests_per_minute": None, "concurrent": None, "tokens_per_minute": None},
            "running": 0,
            "last_minute": {"requests": 1, "tokens": 7},
            "requests": 1,
            "prompt_tokens": 3,
            "cached_tokens": 2,
            "completion_tokens": 4,
        }
