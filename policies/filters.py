"""Filters: hard constraints that drop candidates, each recording why.

A filter takes the request features and the remaining candidates and returns the ones it keeps
plus a :class:`Rejection` for each one it drops. Filters never reorder candidates.

- ``engine-supports``: the engine can serve this kind of request at all (no stored Responses on
  llama.cpp for ``previous_response_id``).
- ``healthy``: the backend's last probe found it ready (``unknown`` passes: not probed yet), and its
  circuit breaker lets a request through (not open, or half-open with no trial out).
- ``context-fits``: the prompt must fit the deployment's window (llama.cpp reports its per-slot
  window; that is the limit a request meets); where some candidates also have room for the whole
  ``max_tokens``, only those stay.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

from policies.decision import Rejection
from policies.types import BackendSnapshot, Deployment, Endpoint, EngineKind, Health, Reason, RequestFeatures

Candidate = tuple[Deployment, BackendSnapshot]
FilterResult = tuple[list[Candidate], list[Rejection]]
Filter = Callable[[RequestFeatures, Sequence[Candidate]], FilterResult]


def healthy(features: RequestFeatures, candidates: Sequence[Candidate]) -> FilterResult:
    kept: list[Candidate] = []
    dropped: list[Rejection] = []
    for deployment, snapshot in candidates:
        if snapshot.circuit_blocks:
            detail = f"circuit {snapshot.circuit} after repeated failures" + (
                f" ({snapshot.error})" if snapshot.error else ""
            )
            dropped.append(Rejection(snapshot.backend_id, Reason.CIRCUIT_OPEN, detail))
        elif snapshot.health in (Health.READY, Health.UNKNOWN):
            kept.append((deployment, snapshot))
        else:
            detail = f"backend is {snapshot.health}" + (f" ({snapshot.error})" if snapshot.error else "")
            dropped.append(Rejection(snapshot.backend_id, Reason.UNHEALTHY, detail))
    return kept, dropped


def context_fits(features: RequestFeatures, candidates: Sequence[Candidate]) -> FilterResult:
    """Drop candidates the prompt does not fit; prefer those where the whole output fits too.

    Both engines accept a ``max_tokens`` larger than the room left (vLLM clamps it, llama.cpp
    stops at the window), so a prompt that fits is never refused for its ``max_tokens`` alone:
    only when some other candidate has room for all of it are the tighter ones dropped. A token count
    (``/v1/messages/count_tokens``) keeps every candidate: it must answer the number the client needs
    to see its prompt is too long, and on a busy engine the character estimate it is routed by ran
    1.4x the engine's count (issue #60: 96,604 "tokens" refused for a prompt served as 68,016).
    """
    if features.endpoint is Endpoint.COUNT_TOKENS:
        return list(candidates), []  # a count is never refused: the engine counts any length
    output = max(features.max_tokens or 0, 1)
    fits_prompt: list[Candidate] = []
    fits_all: list[Candidate] = []
    dropped: list[Rejection] = []
    for deployment, snapshot in candidates:
        window = deployment.context_window
        if window is None or features.prompt_tokens + output <= window:
            fits_all.append((deployment, snapshot))
            fits_prompt.append((deployment, snapshot))
        elif features.prompt_tokens + 1 <= window:
            fits_prompt.append((deployment, snapshot))
        else:
            detail = (
                f"prompt of ~{features.prompt_tokens} tokens exceeds the context window of {window} tokens"
            )
            dropped.append(Rejection(snapshot.backend_id, Reason.CONTEXT_TOO_LONG, detail, window))
    if not fits_all or len(fits_all) == len(fits_prompt):
        return fits_prompt, dropped
    roomy = {id(snapshot) for _, snapshot in fits_all}  # by identity: comparing snapshots is deep
    for deployment, snapshot in fits_prompt:
        if id(snapshot) not in roomy:
            room = (deployment.context_window or 0) - features.prompt_tokens
            detail = f"only ~{room} of max_tokens {output} would fit; another backend has room for all"
            dropped.append(Rejection(snapshot.backend_id, Reason.OUTPUT_WOULD_BE_CUT, detail))
    return fits_all, dropped


def engine_supports(features: RequestFeatures, candidates: Sequence[Candidate]) -> FilterResult:
    """Drop engines that cannot serve the request at all: llama.cpp has no stored Responses
    (``previous_response_id`` is refused there)."""
    if not features.needs_response_store:
        return list(candidates), []
    kept: list[Candidate] = []
    dropped: list[Rejection] = []
    for deployment, snapshot in candidates:
        if snapshot.kind is EngineKind.LLAMACPP:
            detail = "llama.cpp does not support 'previous_response_id'"
            dropped.append(Rejection(snapshot.backend_id, Reason.UNSUPPORTED, detail))
        else:
            kept.append((deployment, snapshot))
    return kept, dropped


FILTERS: dict[str, Filter] = {
    "engine-supports": engine_supports,
    "healthy": healthy,
    "context-fits": context_fits,
}
