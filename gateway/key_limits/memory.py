"""Per-key counts in this process: the counter without ``state.url``, and while Redis is away."""

from __future__ import annotations

import time
from collections import defaultdict, deque
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

from gateway.key_limits.base import (
    MAX_REQUEST_S,
    WINDOW_S,
    Counter,
    KeyUsage,
    Limit,
    Quota,
    Refusal,
    tokens_wait,
)
from policies.types import Usage


@dataclass(slots=True)
class _KeyCounts:
    started: deque[float] = field(default_factory=deque)
    tokens: deque[tuple[float, int]] = field(default_factory=deque)
    running: dict[str, float] = field(default_factory=dict)  # request id -> started
    requests: int = 0
    prompt_tokens: int = 0
    cached_tokens: int = 0
    completion_tokens: int = 0

    def expire(self, now: float) -> None:
        while self.started and self.started[0] <= now - WINDOW_S:
            self.started.popleft()
        while self.tokens and self.tokens[0][0] <= now - WINDOW_S:
            self.tokens.popleft()
        for request_id in [r for r, at in self.running.items() if at <= now - MAX_REQUEST_S]:
            del self.running[request_id]


class MemoryCounter(Counter):
    def __init__(self, clock: Callable[[], float] = time.monotonic) -> None:
        self._keys: defaultdict[str, _KeyCounts] = defaultdict(_KeyCounts)
        self._clock = clock

    async def admit(self, key: str, quota: Quota, request_id: str) -> Refusal | None:
        now, counts = self._clock(), self._keys[key]
        counts.expire(now)
        if quota.concurrent is not None and len(counts.running) >= quota.concurrent:
            return Refusal(Limit.CONCURRENT, 1.0)
        rpm = quota.requests_per_minute
        if rpm is not None and len(counts.started) >= rpm:
            return Refusal(Limit.REQUESTS_PER_MINUTE, counts.started[-rpm] + WINDOW_S - now)
        if quota.tokens_per_minute is not None:
            wait = tokens_wait(counts.tokens, quota.tokens_per_minute, now)
            if wait is not None:
                return Refusal(Limit.TOKENS_PER_MINUTE, wait)
        counts.started.append(now)
        counts.running[request_id] = now
        return None

    async def release(self, key: str, request_id: str, usage: Usage | None) -> None:
        counts = self._keys[key]
        counts.running.pop(request_id, None)
        counts.requests += 1
        if usage is not None:
            counts.tokens.append((self._clock(), usage.prompt_tokens + usage.completion_tokens))
            counts.prompt_tokens += usage.prompt_tokens
            counts.cached_tokens += usage.cached_tokens or 0
            counts.completion_tokens += usage.completion_tokens

    async def usage(self, keys: Sequence[str]) -> dict[str, KeyUsage]:
        now, out = self._clock(), {}
        for key in keys:
            counts = self._keys.get(key) or _KeyCounts()
            counts.expire(now)
            out[key] = KeyUsage(
                running=len(counts.running),
                last_minute_requests=len(counts.started),
                last_minute_tokens=sum(tokens for _, tokens in counts.tokens),
                requests=counts.requests,
                prompt_tokens=counts.prompt_tokens,
                cached_tokens=counts.cached_tokens,
                completion_tokens=counts.completion_tokens,
            )
        return out
