"""Redis that may go away: requests are counted in this process meanwhile, and none fails for it.

``ResilientCounter`` counts in Redis while it answers. When a Redis call fails or times out (0.25 s,
no retries), the request is counted in a local ``MemoryCounter`` instead and ``limits.degraded`` is
logged, at most once per :data:`WARN_EVERY_S`. Until Redis answers again (asked at most once per
:data:`RETRY_EVERY_S`) each replica holds every key to its limits by itself, so N replicas may
together admit up to N times a limit. When it answers, what the requests that ended meanwhile add to
the totals is written back, with the end of those it had admitted (``limits.recovered``); the last
minute's tokens are not, so the tokens-per-minute window starts afresh then.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence

import structlog

from gateway.key_limits.base import Counter, KeyUsage, Quota, Refusal
from gateway.key_limits.memory import MemoryCounter
from gateway.key_limits.redis_counter import RedisCounter, Unsent
from gateway.state.redis_store import FAILURES
from policies.types import Usage

log = structlog.get_logger(__name__)
WARN_EVERY_S = 60.0
RETRY_EVERY_S = 1.0


class ResilientCounter(Counter):
    def __init__(
        self, redis: RedisCounter, local: MemoryCounter, clock: Callable[[], float] = time.monotonic
    ) -> None:
        self.redis = redis
        self.local = local
        self.degraded = False
        self._clock = clock
        self._warned_at = -WARN_EVERY_S
        self._retry_at = 0.0
        self._admitted_here: set[str] = set()  # running requests the local counter admitted
        self._unsent: dict[str, Unsent] = {}

    async def admit(self, key: str, quota: Quota, request_id: str) -> Refusal | None:
        if await self._shared():
            try:
                return await self.redis.admit(key, quota, request_id)
            except FAILURES as exc:
                self._failed(exc)
        refusal = await self.local.admit(key, quota, request_id)
        if refusal is None:
            self._admitted_here.add(request_id)
        return refusal

    async def release(self, key: str, request_id: str, usage: Usage | None) -> None:
        here = request_id in self._admitted_here
        self._admitted_here.discard(request_id)
        if await self._shared():
            try:
                await self.redis.release(key, request_id, usage)
            except FAILURES as exc:
                self._failed(exc)
            else:
                if here:  # its local place
                    await self.local.release(key, request_id, None)
                return
        await self.local.release(key, request_id, usage)
        self._unsent.setdefault(key, Unsent()).add(request_id, usage, shared=not here)

    async def usage(self, keys: Sequence[str]) -> dict[str, KeyUsage]:
        """Redis's counts; while it is away, this replica's own."""
        if await self._shared():
            try:
                return await self.redis.usage(keys)
            except FAILURES as exc:
                self._failed(exc)
        return await self.local.usage(keys)

    async def retry(self) -> None:
        """While degraded, ask Redis again if its retry time has come (``/health`` calls this)."""
        await self._shared()

    async def close(self) -> None:
        await self.redis.close()

    async def _shared(self) -> bool:
        """Whether to count in Redis: while it answers; while it does not, ask it again now and then
        (writing back what it missed)."""
        if not self.degraded:
            return True
        now = self._clock()
        if now < self._retry_at:
            return False
        self._retry_at = now + RETRY_EVERY_S
        unsent, self._unsent = self._unsent, {}
        try:
            await self.redis.write_back(unsent)
        except FAILURES as exc:
            for key, pending in unsent.items():
                self._unsent.setdefault(key, Unsent()).merge(pending)
            self._failed(exc)
            return False
        self.degraded = False
        log.info("limits.recovered", keys=len(unsent))
        return True

    def _failed(self, exc: BaseException) -> None:
        now = self._clock()
        self.degraded = True
        self._retry_at = now + RETRY_EVERY_S
        if now - self._warned_at >= WARN_EVERY_S:
            self._warned_at = now
            log.warning(
                "limits.degraded", error=str(exc) or type(exc).__name__, note="counting key limits locally"
            )
