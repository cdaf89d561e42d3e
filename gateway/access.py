"""API keys and per-key limits for the agents' endpoints (``/v1/...``).

Keys are configured as SHA-256 hashes (``auth.keys``; a plain ``key`` in the config is hashed when the
settings load and never kept or logged). A request presents its key as ``Authorization: Bearer`` or,
for Anthropic clients, ``x-api-key``. With no key configured turnout is open.

Per key, in this process (a Redis-backed count for several replicas comes with the shared store):
requests per minute, concurrent requests and tokens per minute (prompt + completion, counted when a
request ends), each over a sliding minute; a key may be restricted to some models. Usage (requests,
prompt, cached and completion tokens) is kept per key for ``/admin/api/keys``.
"""

from __future__ import annotations

import hashlib
import hmac
import math
import time
from collections import deque
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from gateway.errors import GatewayError, ModelNotFound
from policies.types import Usage

WINDOW_S = 60.0


class Unauthorized(GatewayError):
    status = 401
    type = "invalid_request_error"
    code = "invalid_api_key"


class RateLimited(GatewayError):
    status = 429
    type = "rate_limit_error"
    code = "rate_limit_exceeded"

    def __init__(self, message: str, retry_after_s: float) -> None:
        super().__init__(message)
        self.retry_after_s = max(1, math.ceil(retry_after_s))

    @property
    def headers(self) -> dict[str, str]:
        return {"retry-after": str(self.retry_after_s)}


def digest(key: str) -> str:
    return hashlib.sha256(key.encode()).hexdigest()


@dataclass(frozen=True, slots=True)
class Key:
    name: str
    sha256: str
    models: frozenset[str] | None = None  # None: every model
    requests_per_minute: int | None = None
    concurrent: int | None = None
    tokens_per_minute: int | None = None


@dataclass(slots=True)
class KeyState:
    requests: deque[float] = field(default_factory=deque)
    tokens: deque[tuple[float, int]] = field(default_factory=deque)
    running: int = 0
    total_requests: int = 0
    prompt_tokens: int = 0
    cached_tokens: int = 0
    completion_tokens: int = 0


@dataclass(frozen=True, slots=True)
class Ticket:
    """One admitted request of a key, released once when the request ends."""

    key: str


class Access:
    def __init__(self, keys: Sequence[Key], clock: Callable[[], float] = time.monotonic) -> None:
        self.keys = {k.sha256: k for k in keys}
        self._state = {k.name: KeyState() for k in keys}
        self._clock = clock

    @property
    def enabled(self) -> bool:
        return bool(self.keys)

    def authenticate(self, headers: Mapping[str, str]) -> Key | None:
        """The request's key; None when turnout is open. Raises :class:`Unauthorized`."""
        if not self.keys:
            return None
        presented = headers.get("x-api-key", "")
        bearer = headers.get("authorization", "")
        if bearer.lower().startswith("bearer "):
            presented = bearer[7:].strip()
        if presented:
            hashed = digest(presented)
            for known, key in self.keys.items():
                if hmac.compare_digest(known, hashed):
                    return key
        raise Unauthorized(
            "Invalid or missing API key: send it as Authorization: Bearer <key> (or x-api-key)."
            if presented or bearer
            else "Missing API key: send it as Authorization: Bearer <key> (or x-api-key)."
        )

    def allows(self, key: Key | None, model: str) -> bool:
        return key is None or key.models is None or model in key.models

    def admit(self, key: Key | None, model: str) -> Ticket | None:
        """Count a request of ``key`` for ``model``, or refuse it (404 for a model the key may not use,
        429 over a limit, with the seconds until it would pass)."""
        if key is None:
            return None
        if not self.allows(key, model):
            raise ModelNotFound(
                f"The model `{model}` does not exist or this key may not use it.", param="model"
            )
        now, state = self._clock(), self._state[key.name]
        _expire(state, now)
        if key.concurrent is not None and state.running >= key.concurrent:
            raise RateLimited(f"Key {key.name!r}: {key.concurrent} concurrent requests at most.", 1.0)
        if key.requests_per_minute is not None and len(state.requests) >= key.requests_per_minute:
            wait = state.requests[0] + WINDOW_S - now
            raise RateLimited(
                f"Key {key.name!r}: {key.requests_per_minute} requests per minute at most.", wait
            )
        if key.tokens_per_minute is not None:
            used = sum(tokens for _, tokens in state.tokens)
            if used >= key.tokens_per_minute:
                wait = state.tokens[0][0] + WINDOW_S - now
                raise RateLimited(
                    f"Key {key.name!r}: {key.tokens_per_minute} tokens per minute at most.", wait
                )
        state.requests.append(now)
        state.running += 1
        state.total_requests += 1
        return Ticket(key.name)

    def release(self, ticket: Ticket | None, usage: Usage | None) -> None:
        if ticket is None:
            return
        state = self._state[ticket.key]
        state.running = max(state.running - 1, 0)
        if usage is not None:
            state.tokens.append((self._clock(), usage.prompt_tokens + usage.completion_tokens))
            state.prompt_tokens += usage.prompt_tokens
            state.cached_tokens += usage.cached_tokens or 0
            state.completion_tokens += usage.completion_tokens

    def usage(self) -> list[dict[str, Any]]:
        now = self._clock()
        out = []
        for key in self.keys.values():
            state = self._state[key.name]
            _expire(state, now)
            out.append(
                {
                    "name": key.name,
                    "models": sorted(key.models) if key.models is not None else None,
                    "limits": {
                        "requests_per_minute": key.requests_per_minute,
                        "concurrent": key.concurrent,
                        "tokens_per_minute": key.tokens_per_minute,
                    },
                    "running": state.running,
                    "last_minute": {
                        "requests": len(state.requests),
                        "tokens": sum(t for _, t in state.tokens),
                    },
                    "requests": state.total_requests,
                    "prompt_tokens": state.prompt_tokens,
                    "cached_tokens": state.cached_tokens,
                    "completion_tokens": state.completion_tokens,
                }
            )
        return out


def _expire(state: KeyState, now: float) -> None:
    while state.requests and state.requests[0] <= now - WINDOW_S:
        state.requests.popleft()
    while state.tokens and state.tokens[0][0] <= now - WINDOW_S:
        state.tokens.popleft()
