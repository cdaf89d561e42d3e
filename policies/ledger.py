"""What a router knows of a backend from its own traffic alone (``RouterView``): the requests it sent
there and has not seen end, their prompt tokens (those still before their first token apart), how many
it sent in the last minute, and the latencies it measured. The published routers read this and the
engines' metrics, never an engine model (``policies.peers``); the gateway keeps it (``gateway.routing``
and the fleet's in-flight requests) and passes it in with the routing context."""

from __future__ import annotations

import msgspec


class RouterView(msgspec.Struct, frozen=True):
    """One backend, as the router's own bookkeeping sees it."""

    in_flight: int = 0
    """Requests sent there and not ended (a stream counts until its last event)."""
    open_tokens: int = 0
    """Prompt tokens of those requests."""
    prefill_tokens: int = 0
    """Prompt tokens of those still waiting for their first token."""
    sent_last_minute: int = 0
    """Requests sent there in the last 60 s."""
    sent_total: int = 0
    """Requests sent there since the router started."""
    latency_per_token: tuple[float, ...] = ()
    """Seconds per output token of its recent answers, as LiteLLM keeps them (``policies.peers``)."""
    ttft_per_token: tuple[float, ...] = ()
    """Seconds to the first token per output token of its recent streamed answers (ditto)."""


IDLE = RouterView()
