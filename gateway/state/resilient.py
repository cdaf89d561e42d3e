"""Redis that may go away: every write goes to a local copy too, and Redis failures never reach a client.

``ResilientStore`` wraps the shared ``RedisStore`` and a local ``MemoryStore`` mirror. Writes go to
both (Redis first; a Redis failure is noted, not raised); reads come from Redis while it answers and
from the mirror while it does not (``degraded``). A failure logs ``state.degraded`` at most once per
``WARN_EVERY_S``. Every Redis call times out after ``state.timeout_s`` (0.25 s), and while degraded
Redis is tried once per ``RETRY_S``, so a slow Redis costs a request at most one timeout. When Redis
answers again the gateway writes back what it learned meanwhile (the sessions it saved and the slots
it claimed) and logs ``state.recovered``. The prefix index is the
mirror's, fed by this replica's requests and the other replicas' records (``prompt_log``); records
made while Redis was away stay with the replica that made them.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Awaitable, Callable, Sequence
from typing import Any, TypeVar

import structlog

from gateway.state.base import StateStore
from gateway.state.memory import MemoryStore
from gateway.state.prefix_index import SentPrompt
from gateway.state.redis_store import FAILURES, RedisStore, follow_prompts
from policies.prefix import PromptChain
from policies.types import PrefixMatch, SessionView, SlotLease

log = structlog.get_logger(__name__)
T = TypeVar("T")
WARN_EVERY_S = 60.0
RETRY_S = 1.0
"""While degraded, Redis is tried again (a ping) at most this often; calls between use local state."""


async def _skip() -> None:
    """The fallback of a write the local mirror already has."""


class ResilientStore(StateStore):
    def __init__(
        self, redis: RedisStore, local: MemoryStore, clock: Callable[[], float] = time.monotonic
    ) -> None:
        self.redis = redis
        self.local = local
        self.degraded = False
        self._warned_at = -WARN_EVERY_S
        self._retry_at = 0.0
        self._clock = clock
        self._pending: dict[str, SessionView] = {}  # saved while Redis was away: written back on return
        self._pending_claims: dict[tuple[str, int], tuple[str, float, int]] = {}
        self._recovering = asyncio.Lock()  # one call asks Redis and writes back; the others wait for it

    async def _shared(self, call: Callable[[], Awaitable[T]], fallback: Callable[[], Awaitable[T]]) -> T:
        if self.degraded:
            if self._clock() < self._retry_at:  # a slow Redis must not cost every call its timeout
                return await fallback()
            await self._recover()  # first: a read must see what is written back
            if self.degraded:
                return await fallback()
        try:
            return await call()
        except FAILURES as exc:
            self._failed(exc)
            return await fallback()

    def _failed(self, exc: BaseException) -> None:
        self.degraded = True
        now = self._clock()
        self._retry_at = now + RETRY_S
        if now - self._warned_at >= WARN_EVERY_S:
            self._warned_at = now
            log.warning("state.degraded", error=str(exc) or type(exc).__name__, note="routing on local state")

    async def retry(self) -> None:
        """While degraded, ask Redis again if its retry time has come (``/health`` calls this, so an
        idle gateway does not report ``degraded`` after Redis is back)."""
        if self.degraded:
            await self._recover()

    async def _recover(self) -> None:
        """If Redis answers again, write back the sessions saved and the slots claimed meanwhile."""
        async with self._recovering:
            if self.degraded and self._clock() >= self._retry_at:  # else a call before this one asked
                await self._write_back()

    async def _write_back(self) -> None:
        try:
            await self.redis.ping()
            for session in self._pending.values():
                await self.redis.save_session(session)
            for (backend, slot), (key, at, tokens) in self._pending_claims.items():
                await self.redis.claim_slot(backend, slot, key, at, None, tokens)
        except FAILURES as exc:
            self._failed(exc)
            return
        log.info("state.recovered", sessions=len(self._pending), slots=len(self._pending_claims))
        self._pending.clear()
        self._pending_claims.clear()
        self.degraded = False

    async def get_session(self, key: str) -> SessionView | None:
        return await self._shared(lambda: self.redis.get_session(key), lambda: self.local.get_session(key))

    async def find_session(self, chain: PromptChain) -> str | None:
        key = self.local.index.find_session(chain)  # the others' records are in it too
        return key if key is not None and await self.get_session(key) is not None else None

    async def save_session(self, session: SessionView) -> None:
        await self.local.save_session(session)

        async def remember() -> None:
            self._pending[session.key] = session

        await self._shared(lambda: self.redis.save_session(session), remember)

    async def record_prompt(self, sent: SentPrompt) -> None:
        await self.local.record_prompt(sent)
        self.redis.queue_prompt(sent)  # sent with finish_turn

    def launched(self, backend_id: str, slot: int | None, chain: PromptChain, tokens: int) -> None:
        self.local.launched(backend_id, slot, chain, tokens)

    async def match_prefix(self, chain: PromptChain, backend_ids: Sequence[str]) -> dict[str, PrefixMatch]:
        return await self.local.match_prefix(chain, backend_ids)

    async def leases(self, backend_id: str) -> tuple[SlotLease, ...]:
        return await self._shared(
            lambda: self.redis.leases(backend_id), lambda: self.local.leases(backend_id)
        )

    async def claim_slot(
        self,
        backend_id: str,
        slot: int,
        session_key: str,
        now: float,
        expected_owner: str | None,
        tokens: int = 0,
    ) -> bool:
        async def locally() -> bool:
            claimed = await self.local.claim_slot(backend_id, slot, session_key, now, expected_owner, tokens)
            if claimed:
                self._pending_claims[(backend_id, slot)] = (session_key, now, tokens)
            return claimed

        claimed = await self._shared(
            lambda: self.redis.claim_slot(backend_id, slot, session_key, now, expected_owner, tokens), locally
        )
        if claimed and not self.degraded:  # mirror the shared truth
            self.local.set_lease(backend_id, slot, session_key, now, tokens)
        return claimed

    async def forget_backend(self, backend_id: str) -> None:
        await self.local.forget_backend(backend_id)
        self._pending_claims = {k: v for k, v in self._pending_claims.items() if k[0] != backend_id}
        await self._shared(lambda: self.redis.forget_backend(backend_id), _skip)

    async def release_slots(self, session_key: str) -> list[tuple[str, int]]:
        await self.local.release_slots(session_key)
        return await self._shared(
            lambda: self.redis.release_slots(session_key), lambda: self.local.release_slots(session_key)
        )

    async def sessions(self, limit: int) -> list[SessionView]:
        return await self._shared(lambda: self.redis.sessions(limit), lambda: self.local.sessions(limit))

    async def record_turn(self, key: str, turn: dict[str, Any]) -> None:
        await self.local.record_turn(key, turn)

        await self._shared(lambda: self.redis.record_turn(key, turn), _skip)

    async def turns(self, key: str) -> list[dict[str, Any]]:
        return await self._shared(lambda: self.redis.turns(key), lambda: self.local.turns(key))

    async def record_decision(self, entry: dict[str, Any]) -> None:
        await self.local.record_decision(entry)

        await self._shared(lambda: self.redis.record_decision(entry), _skip)

    async def finish_turn(
        self, session: SessionView | None, turn: dict[str, Any] | None, decision: dict[str, Any]
    ) -> None:
        await self.local.finish_turn(session, turn, decision)

        async def remember() -> None:
            if session is not None:
                self._pending[session.key] = session

        await self._shared(lambda: self.redis.finish_turn(session, turn, decision), remember)

    async def save_policy(self, policy: dict[str, Any]) -> None:
        await self.local.save_policy(policy)

        await self._shared(lambda: self.redis.save_policy(policy), _skip)

    async def policy(self) -> dict[str, Any] | None:
        return await self._shared(self.redis.policy, self.local.policy)

    async def decisions(self, limit: int) -> list[dict[str, Any]]:
        return await self._shared(lambda: self.redis.decisions(limit), lambda: self.local.decisions(limit))

    shared_by_replicas = True

    async def follow(self) -> None:
        await follow_prompts(self.redis, self.local.index)

    async def share(self, kind: str, value: bytes, ttl_s: float) -> None:
        await self._shared(lambda: self.redis.share(kind, value, ttl_s), _skip)

    async def shared(self, kind: str) -> list[bytes]:
        async def nobody() -> list[bytes]:
            return []

        return await self._shared(lambda: self.redis.shared(kind), nobody)
