"""API keys and per-key limits for the agents' endpoints (``/v1/...``).

Keys are configured as SHA-256 hashes (``auth.keys``; a plain ``key`` in the config is hashed when the
settings load and never kept or logged). A request presents its key as ``Authorization: Bearer`` or,
for Anthropic clients, ``x-api-key``. With no key configured turnout is open.

Per key: requests per minute, concurrent requests and tokens per minute (prompt + completion, counted
when a request ends), each over a sliding minute; over one, 429 with ``retry-after``. A key may be
restricted to some models (404 for the others, as for a model that does not exist). Usage (requests
that ended; prompt, cached and completion tokens) is kept per key for ``/admin/api/keys``.

The counting is a ``gateway.key_limits.Counter``: in this process by default; in Redis when
``state.url`` is set, so that every replica holds a key to the same limits (counted locally while
Redis is away: no request fails for it). Authentication and the model check are local and sync.
"""

from __future__ import annotations

import hashlib
import hmac
import math
import uuid
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from gateway.errors import GatewayError, ModelNotFound
from gateway.key_limits import Counter, Limit, MemoryCounter, Quota
from policies.types import Usage

COUNTED = {
    Limit.REQUESTS_PER_MINUTE: "requests per minute",
    Limit.CONCURRENT: "concurrent requests",
    Limit.TOKENS_PER_MINUTE: "tokens per minute",
}
"""What each limit counts, for the 429's message."""


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

    def _headers(self) -> dict[str, str]:
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

    @property
    def quota(self) -> Quota:
        return Quota(self.requests_per_minute, self.concurrent, self.tokens_per_minute)


@dataclass(frozen=True, slots=True)
class Ticket:
    """One admitted request of a key, released once when the request ends."""

    key: str
    request_id: str


class Access:
    def __init__(self, keys: Sequence[Key], counter: Counter | None = None) -> None:
        self.keys = {k.sha256: k for k in keys}
        self.counter = counter or MemoryCounter()

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

    async def admit(self, key: Key | None, model: str) -> Ticket | None:
        """Count a request of ``key`` for ``model``, or refuse it (404 for a model the key may not use,
        429 over a limit, with the seconds until it would pass)."""
        if key is None:
            return None
        if not self.allows(key, model):
            raise ModelNotFound(
                f"The model `{model}` does not exist or this key may not use it.", param="model"
            )
        ticket = Ticket(key.name, uuid.uuid4().hex)
        refusal = await self.counter.admit(key.name, key.quota, ticket.request_id)
        if refusal is not None:
            allowed = getattr(key.quota, refusal.limit.value)
            message = f"Key {key.name!r}: {allowed} {COUNTED[refusal.limit]} at most."
            raise RateLimited(message, refusal.wait_s)
        return ticket

    async def release(self, ticket: Ticket | None, usage: Usage | None) -> None:
        if ticket is not None:
            await self.counter.release(ticket.key, ticket.request_id, usage)

    async def usage(self) -> list[dict[str, Any]]:
        """Each key's limits and counts, for ``/admin/api/keys`` (names only, never keys)."""
        keys = list(self.keys.values())
        counts = await self.counter.usage([key.name for key in keys])
        out = []
        for key in keys:
            used = counts[key.name]
            out.append(
                {
                    "name": key.name,
                    "models": sorted(key.models) if key.models is not None else None,
                    "limits": {
                        "requests_per_minute": key.requests_per_minute,
                        "concurrent": key.concurrent,
                        "tokens_per_minute": key.tokens_per_minute,
                    },
                    "running": used.running,
                    "last_minute": {
                        "requests": used.last_minute_requests,
                        "tokens": used.last_minute_tokens,
                    },
                    "requests": used.requests,
                    "prompt_tokens": used.prompt_tokens,
                    "cached_tokens": used.cached_tokens,
                    "completion_tokens": used.completion_tokens,
                }
            )
        return out

    async def close(self) -> None:
        await self.counter.close()
