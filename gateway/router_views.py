"""What a router knows of each backend from its own traffic (``policies.ledger.RouterView``), kept for
the published routers' profiles (``policies.peers``): the requests it has open there (the fleet's own
in-flight requests: ``Fleet.own``), those it sent in the last minute, and the latencies it measured,
kept as LiteLLM keeps them."""

from __future__ import annotations

from collections import deque

from backends.fleet import Fleet
from policies.decision import Outcome
from policies.ledger import RouterView
from policies.peers import litellm_samples

MINUTE_S = 60.0


class RouterHistory:
    """Sends and measured latencies per backend (this replica's own)."""

    def __init__(self) -> None:
        self._sent: dict[str, deque[float]] = {}
        self._total: dict[str, int] = {}
        self._latency: dict[str, tuple[float, ...]] = {}
        self._ttft: dict[str, tuple[float, ...]] = {}

    def sent(self, backend: str, now: float) -> None:
        """A request was routed to ``backend`` at ``now``."""
        times = self._sent.setdefault(backend, deque())
        times.append(now)
        self._total[backend] = self._total.get(backend, 0) + 1
        while times and times[0] < now - MINUTE_S:
            times.popleft()

    def answered(self, outcome: Outcome) -> None:
        """A request answered: its seconds per output token (and to the first token, streamed)."""
        tokens = outcome.usage.completion_tokens
        if tokens <= 0:
            return
        backend = outcome.backend_id
        self._latency[backend] = litellm_samples(self._latency.get(backend, ()), outcome.duration_s / tokens)
        if outcome.stream and outcome.ttft_s is not None:
            self._ttft[backend] = litellm_samples(self._ttft.get(backend, ()), outcome.ttft_s / tokens)

    def view(self, fleet: Fleet, backend: str, now: float) -> RouterView:
        own = fleet.own(backend)
        sent = self._sent.get(backend)
        while sent and sent[0] < now - MINUTE_S:
            sent.popleft()
        return RouterView(
            in_flight=own.requests,
            open_tokens=own.tokens,
            prefill_tokens=own.prefilling,
            sent_last_minute=len(sent) if sent else 0,
            sent_total=self._total.get(backend, 0),
            latency_per_token=self._latency.get(backend, ()),
            ttft_per_token=self._ttft.get(backend, ()),
        )
