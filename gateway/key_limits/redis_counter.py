"""Per-key counts in Redis (``state.url``), so that every gateway replica sees the same limits.

Keys (``<prefix>`` = ``state.prefix``, ``v1`` the state layout's :data:`VERSION`; ``<name>`` the
key's configured name, never the key):

    <prefix>:v1:key:<name>:requests  zset  request id -> started, the last minute's (expires idle)
    <prefix>:v1:key:<name>:tokens    zset  "<request id>:<tokens>" -> ended, the last minute's (expires idle)
    <prefix>:v1:key:<name>:running   zset  request id -> started, while it runs (at most MAX_REQUEST_S)
    <prefix>:v1:key:<name>:usage     hash  requests, prompt_tokens, cached_tokens, completion_tokens (kept)

An admission is one Lua script (:data:`ADMIT`): it drops what left the windows, checks the limits
and records the request in one step, so two replicas admitting at once never exceed a limit. A
release is one MULTI/EXEC round trip. Times are the replicas' wall clocks: replicas whose clocks
disagree by a second shift each other's windows by a second (run them with NTP).
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from gateway.key_limits.base import MAX_REQUEST_S, WINDOW_S, Counter, KeyUsage, Limit, Quota, Refusal
from gateway.state.redis_store import VERSION, connect
from policies.types import Usage

ADMIT = """
local now, window, lifetime = tonumber(ARGV[1]), tonumber(ARGV[2]), tonumber(ARGV[3])
local rpm, concurrent, tpm = tonumber(ARGV[5]), tonumber(ARGV[6]), tonumber(ARGV[7])
redis.call('ZREMRANGEBYSCORE', KEYS[1], '-inf', now - window)
redis.call('ZREMRANGEBYSCORE', KEYS[2], '-inf', now - window)
redis.call('ZREMRANGEBYSCORE', KEYS[3], '-inf', now - lifetime)
if concurrent > 0 and redis.call('ZCARD', KEYS[3]) >= concurrent then
  return {'concurrent', '1'}
end
if rpm > 0 then
  local started = redis.call('ZCARD', KEYS[1])
  if started >= rpm then
    local leaving = redis.call('ZRANGE', KEYS[1], started - rpm, started - rpm, 'WITHSCORES')
    return {'requests_per_minute', tostring(tonumber(leaving[2]) + window - now)}
  end
end
if tpm > 0 then
  local ended = redis.call('ZRANGE', KEYS[2], 0, -1, 'WITHSCORES')
  local used = 0
  for i = 1, #ended, 2 do used = used + tonumber(string.match(ended[i], ':(%d+)$')) end
  if used >= tpm then
    for i = 1, #ended, 2 do
      used = used - tonumber(string.match(ended[i], ':(%d+)$'))
      if used < tpm then return {'tokens_per_minute', tostring(tonumber(ended[i + 1]) + window - now)} end
    end
  end
end
redis.call('ZADD', KEYS[1], ARGV[1], ARGV[4])
redis.call('ZADD', KEYS[3], ARGV[1], ARGV[4])
redis.call('PEXPIRE', KEYS[1], math.ceil(window * 1000))
redis.call('PEXPIRE', KEYS[3], math.ceil(lifetime * 1000))
return false
"""
"""KEYS: requests, tokens, running. ARGV: now, window s, lifetime s, request id, then requests per
minute, concurrent, tokens per minute (0: no limit). Returns nil (admitted) or {limit, wait s}
(a string: Redis would cut a Lua number to an integer)."""

TOTALS = ("requests", "prompt_tokens", "cached_tokens", "completion_tokens")


def totals_of(usage: Usage | None) -> dict[str, int]:
    """What one ended request adds to its key's totals."""
    if usage is None:
        return {"requests": 1}
    return {
        "requests": 1,
        "prompt_tokens": usage.prompt_tokens,
        "cached_tokens": usage.cached_tokens or 0,
        "completion_tokens": usage.completion_tokens,
    }


@dataclass(slots=True)
class Unsent:
    """What a key's ended requests added while Redis was away, written back when it answers again."""

    totals: dict[str, int] = field(default_factory=dict)
    ended: set[str] = field(default_factory=set)
    """Requests admitted in Redis that ended meanwhile: their running entries go."""

    def add(self, request_id: str, usage: Usage | None, *, shared: bool) -> None:
        self.merge(Unsent(totals_of(usage), {request_id} if shared else set()))

    def merge(self, other: Unsent) -> None:
        for name, amount in other.totals.items():
            self.totals[name] = self.totals.get(name, 0) + amount
        self.ended |= other.ended


class RedisCounter(Counter):
    def __init__(
        self,
        url: str,
        *,
        prefix: str = "turnout",
        timeout_s: float = 0.25,
        clock: Callable[[], float] = time.time,
    ) -> None:
        self._redis = connect(url, timeout_s)
        self._ns = f"{prefix}:{VERSION}:key"
        self._clock = clock
        self._admit = self._redis.register_script(ADMIT)

    def _key(self, key: str, kind: str) -> str:
        return f"{self._ns}:{key}:{kind}"

    async def close(self) -> None:
        await self._redis.aclose()

    async def admit(self, key: str, quota: Quota, request_id: str) -> Refusal | None:
        limits = (quota.requests_per_minute, quota.concurrent, quota.tokens_per_minute)
        refused = await self._admit(
            keys=[self._key(key, kind) for kind in ("requests", "tokens", "running")],
            args=[repr(self._clock()), WINDOW_S, MAX_REQUEST_S, request_id, *(n or 0 for n in limits)],
        )
        if refused is None:
            return None
        limit, wait = (_text(part) for part in refused)
        return Refusal(Limit(limit), float(wait))

    async def release(self, key: str, request_id: str, usage: Usage | None) -> None:
        pipe = self._redis.pipeline(transaction=True)
        pipe.zrem(self._key(key, "running"), request_id)
        if usage is not None:
            tokens = self._key(key, "tokens")
            spent = usage.prompt_tokens + usage.completion_tokens
            pipe.zadd(tokens, {f"{request_id}:{spent}": self._clock()})
            pipe.pexpire(tokens, math.ceil(WINDOW_S * 1000))
        self._add_totals(pipe, key, totals_of(usage))
        await pipe.execute()

    def _add_totals(self, pipe: Any, key: str, totals: Mapping[str, int]) -> None:
        for name, amount in totals.items():
            if amount:
                pipe.hincrby(self._key(key, "usage"), name, amount)

    async def write_back(self, unsent: Mapping[str, Unsent]) -> None:
        """Add what ended while Redis was away (raises if it is still away: it pings at least)."""
        pipe = self._redis.pipeline(transaction=False)
        pipe.ping()
        for key, pending in unsent.items():
            self._add_totals(pipe, key, pending.totals)
            if pending.ended:
                pipe.zrem(self._key(key, "running"), *pending.ended)
        await pipe.execute()

    async def usage(self, keys: Sequence[str]) -> dict[str, KeyUsage]:
        now = self._clock()
        pipe = self._redis.pipeline(transaction=False)
        for key in keys:
            pipe.zcount(self._key(key, "requests"), f"({now - WINDOW_S!r}", "+inf")
            pipe.zrangebyscore(self._key(key, "tokens"), f"({now - WINDOW_S!r}", "+inf")
            pipe.zcount(self._key(key, "running"), f"({now - MAX_REQUEST_S!r}", "+inf")
            pipe.hgetall(self._key(key, "usage"))
        replies = await pipe.execute()
        out = {}
        for n, key in enumerate(keys):
            started, ended, running, totals = replies[4 * n : 4 * n + 4]
            counts = {_text(name): int(value) for name, value in totals.items()}
            out[key] = KeyUsage(
                running=int(running),
                last_minute_requests=int(started),
                last_minute_tokens=sum(int(_text(member).rsplit(":", 1)[1]) for member in ended),
                **{name: counts.get(name, 0) for name in TOTALS},
            )
        return out


def _text(value: Any) -> str:
    """A reply as redis-py returns it (bytes without ``decode_responses``; its stubs allow more)."""
    return value.decode() if isinstance(value, bytes) else str(value)
