"""The store a gateway on Redis uses: it answers from a local copy while Redis is away or slow, asks
Redis again at most once per retry period, and writes back what it claimed meanwhile."""

from __future__ import annotations

import asyncio
from typing import Any

from gateway.state import MemoryStore
from gateway.state.resilient import RETRY_S, ResilientStore
from policies.types import SessionView, SlotLease
from tests.gateway.state_helpers import Clock, run


class LateRedis:
    """A Redis that answers no call within the timeout: each call it is asked is counted, then times out."""

    def __init__(self) -> None:
        self.calls = 0

    async def _late(self) -> Any:
        self.calls += 1
        raise TimeoutError("Timeout reading from 127.0.0.1:6379")

    async def ping(self) -> None:
        await self._late()

    async def get_session(self, key: str) -> SessionView | None:
        return await self._late()  # type: ignore[no-any-return]

    async def save_session(self, session: SessionView) -> None:
        await self._late()


def test_a_slow_redis_is_asked_once_per_retry_period() -> None:
    """Once a call timed out, the gateway's store answers from its local copy and asks Redis again (a
    ping) at most once per RETRY_S: a slow Redis costs one call a timeout, not every call."""
    clock, late = Clock(), LateRedis()
    store = ResilientStore(late, MemoryStore(clock=clock), clock)  # type: ignore[arg-type]
    session = SessionView("s", turns=1, last_seen=clock.now)
    run(store.save_session(session))
    assert (late.calls, store.degraded) == (1, True)
    for _ in range(20):
        assert run(store.get_session("s")) == session  # the local copy
    assert late.calls == 1
    clock.now += RETRY_S / 2
    run(store.get_session("s"))
    assert late.calls == 1
    clock.now += RETRY_S / 2
    for _ in range(20):
        assert run(store.get_session("s")) == session
    assert (late.calls, store.degraded) == (2, True)  # one ping, which timed out too


class ReturningRedis:
    """A Redis away, then back (``up``): each write takes a round trip, in which other calls run."""

    def __init__(self) -> None:
        self.up = False
        self.claimed: list[tuple[str, int, str]] = []

    def _reached(self) -> None:
        if not self.up:
            raise ConnectionRefusedError("Connection refused")

    async def ping(self) -> None:
        self._reached()

    async def claim_slot(
        self, backend_id: str, slot: int, session_key: str, now: float, expected: str | None, tokens: int = 0
    ) -> bool:
        self._reached()
        await asyncio.sleep(0)
        self.claimed.append((backend_id, slot, session_key))
        return True

    async def leases(self, backend_id: str) -> tuple[SlotLease, ...]:
        self._reached()
        return ()


def test_requests_racing_when_redis_returns_see_it_written_back_once() -> None:
    """Several calls find Redis back at once (a request, the replicas' sync, the policy poll): one
    writes back what was claimed meanwhile, the others wait for it; none fails (calls racing through
    the write-back used to fail: "dictionary changed size during iteration", a 500)."""
    clock, redis = Clock(), ReturningRedis()
    store = ResilientStore(redis, MemoryStore(clock=clock), clock)  # type: ignore[arg-type]
    assert run(store.claim_slot("llama", 0, "a", clock.now, None))  # locally: Redis is away
    assert run(store.claim_slot("llama", 1, "b", clock.now, None))
    redis.up = True
    clock.now += RETRY_S

    async def race() -> list[tuple[SlotLease, ...]]:
        return await asyncio.gather(*(store.leases("llama") for _ in range(3)))

    assert run(race()) == [(), (), ()]  # Redis's answers
    assert not store.degraded
    assert redis.claimed == [("llama", 0, "a"), ("llama", 1, "b")]  # written back, each once


def test_retry_asks_a_returned_redis_without_traffic() -> None:
    """``/health`` calls ``retry``: an idle gateway finds Redis back (and writes back what it claimed
    meanwhile) once the retry period has passed, not before; a healthy store asks nothing."""
    clock, redis = Clock(), ReturningRedis()
    store = ResilientStore(redis, MemoryStore(clock=clock), clock)  # type: ignore[arg-type]
    assert run(store.claim_slot("llama", 0, "a", clock.now, None))  # locally: Redis is away
    assert store.degraded
    redis.up = True
    run(store.retry())
    assert store.degraded  # the retry period has not passed
    clock.now += RETRY_S
    run(store.retry())
    assert not store.degraded
    assert redis.claimed == [("llama", 0, "a")]
    redis.up = False
    run(store.retry())  # not degraded: nothing is asked
    assert not store.degraded
