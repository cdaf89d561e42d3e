"""The facts of one request, gathered as it goes, written once as the canonical log line."""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import structlog

from policies.types import Usage

log = structlog.get_logger("turnout.request")


@dataclass(slots=True)
class RequestRecord:
    """Mutable only while its request runs; logged once by :meth:`emit`."""

    endpoint: str
    started: float = field(default_factory=time.monotonic)
    request_id: str = field(
        default_factory=lambda: str(structlog.contextvars.get_contextvars().get("request_id", ""))
    )
    model: str | None = None
    stream: bool = False
    backend: str | None = None
    reason: str | None = None
    status: int = 200
    first_token_at: float | None = None  # None: not observed (a whole body without engine timings)
    usage: Usage | None = None
    retries: int = 0
    error: str | None = None
    predicted_ttft: float | None = None  # the chosen candidate's, in seconds
    residency_wait_s: float | None = None  # waited for a residency switch to wake its backend
    key: str | None = None  # the API key's name (never the key)
    ticket: Any = None  # the key's admission (gateway.access.Ticket), released when the request ends
    observer: Callable[[RequestRecord, float], None] | None = None  # the metrics, given the duration
    clock: Callable[[], float] = time.monotonic  # what ``started`` was read from
    emitted: bool = False

    @property
    def ttft_s(self) -> float | None:
        """Seconds from when turnout received the request to the engine's first token, where
        observed (``backends.stream.ResponseRelay.first_token_at``). An engine whose reported decode
        time is longer than the whole request (a simulator reporting simulated time while it runs
        faster) gives no first token either."""
        if self.first_token_at is None or self.first_token_at < self.started:
            return None
        return self.first_token_at - self.started

    def emit(self) -> None:
        if self.emitted:
            return
        self.emitted = True
        now = self.clock()
        if self.observer is not None:
            self.observer(self, now - self.started)
        usage = self.usage
        log.info(
            "request.completed",
            endpoint=self.endpoint,
            model=self.model,
            stream=self.stream,
            backend=self.backend,
            reason=self.reason,
            status=self.status,
            ttft_ms=None if self.ttft_s is None else round(self.ttft_s * 1000, 1),
            duration_ms=round((now - self.started) * 1000, 1),
            prompt_tokens=usage.prompt_tokens if usage else None,
            completion_tokens=usage.completion_tokens if usage else None,
            cached_tokens=usage.cached_tokens if usage else None,
            retries=self.retries,
            residency_wait_s=self.residency_wait_s,
            error=self.error,
            key=self.key,
        )
