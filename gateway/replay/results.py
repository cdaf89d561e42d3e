"""What a replay measures of each request (``Result``, in simulated seconds) and the request it sends
for a trace line (``request_body``, ``request_headers``): shared by the wall replay (``runner``), the
virtual one (``virtual``), the oracle and the reports."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from gateway.replay.synth import request_messages
from gateway.replay.traces import BLOCK_TOKENS, TraceRequest
from policies.awaited import WAIT_HEADER

ORACLE = "oracle"
"""The name a report gives the oracle's run."""
BEST_SCHEDULE = "best-schedule"
"""The name of the best of the oracle's schedule and its sampled ones (``simulate``'s ``schedules``)."""
LOOKAHEAD = "look-ahead"
"""The name of the look-ahead oracle's run (``simulate``'s ``lookahead``)."""


@dataclass(frozen=True, slots=True)
class Result:
    """One replayed request, in simulated seconds (``start_s``: when it was sent)."""

    index: int
    session: str | None
    arrival_s: float
    start_s: float
    backend: str | None
    ttft_s: float | None
    completion_s: float
    prompt_tokens: int
    cached_tokens: int
    completion_tokens: int
    error: str | None = None

    @property
    def end_s(self) -> float:
        return self.start_s + self.completion_s

    @property
    def ok(self) -> bool:
        return self.error is None and self.ttft_s is not None


def request_body(
    request: TraceRequest, block_tokens: int = BLOCK_TOKENS, *, answer_cap: bool = True
) -> dict[str, Any]:
    """The streamed chat request for ``request`` (synthesized messages, ``ignore_eos``, usage on).

    ``answer_cap``: send the answer's length as ``max_tokens``, where a real engine must be told where
    to stop (the wall replay). The virtual replay ends each answer at its length itself and sends no
    ``max_tokens``, as coding agents' clients send none or a ceiling far above any answer: a router
    that caps its expected answer by ``max_tokens`` (``policies.cost.expected_output``) would read
    the trace's answer from the request, which no client tells."""
    body: dict[str, Any] = {
        "model": request.model,
        "messages": request_messages(request, block_tokens),
        "stream": True,
        "stream_options": {"include_usage": True},
        "ignore_eos": True,
    }
    if answer_cap:
        body["max_tokens"] = request.max_tokens
    return body


def request_headers(request: TraceRequest) -> dict[str, str]:
    """``x-session-id`` when the trace names a session; ``x-turnout-wait-for: last-token`` for an
    agent's call (``TraceRequest.agent``)."""
    headers = {"x-session-id": request.session} if request.session else {}
    return {**headers, WAIT_HEADER: "last-token"} if request.agent else headers
