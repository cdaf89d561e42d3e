"""Filters: hard constraints that drop candidates, each recording why.

A filter takes the request features and the remaining candidates and returns the ones it keeps
plus a :class:`Rejection` for each one it drops. Filters never reorder candidates.

- ``healthy``: the backend's last probe found it ready (``unknown`` passes: not probed yet).
- ``context-fits``: ``prompt_tokens + max(max_tokens, 1) <= context_window`` of the deployment
  (llama.cpp reports its per-slot window; that is the limit a request meets).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

from policies.types import BackendSnapshot, Deployment, Health, Reason, Rejection, RequestFeatures

Candidate = tuple[Deployment, BackendSnapshot]
FilterResult = tuple[list[Candidate], list[Rejection]]
Filter = Callable[[RequestFeatures, Sequence[Candidate]], FilterResult]


def healthy(features: RequestFeatures, candidates: Sequence[Candidate]) -> FilterResult:
    kept: list[Candidate] = []
    dropped: list[Rejection] = []
    for deployment, snapshot in candidates:
        if snapshot.health in (Health.READY, Health.UNKNOWN):
            kept.append((deployment, snapshot))
        else:
            detail = f"backend is {snapshot.health}" + (f" ({snapshot.error})" if snapshot.error else "")
            dropped.append(Rejection(snapshot.backend_id, Reason.UNHEALTHY, detail))
    return kept, dropped


def context_fits(features: RequestFeatures, candidates: Sequence[Candidate]) -> FilterResult:
    kept: list[Candidate] = []
    dropped: list[Rejection] = []
    needed = features.prompt_tokens + max(features.max_tokens or 0, 1)
    for deployment, snapshot in candidates:
        window = deployment.context_window
        if window is None or needed <= window:
            kept.append((deployment, snapshot))
        else:
            detail = (
                f"prompt of ~{features.prompt_tokens} tokens + max_tokens {features.max_tokens or 0}"
                f" exceeds the context window of {window} tokens"
            )
            dropped.append(Rejection(snapshot.backend_id, Reason.CONTEXT_TOO_LONG, detail))
    return kept, dropped


FILTERS: dict[str, Filter] = {
    "healthy": healthy,
    "context-fits": context_fits,
}
