"""Scorers: soft preferences over the candidates that passed the filters, each in [0, 1].

A scorer sees all candidates at once (some scores are relative to the best) and returns one value
per candidate, higher is better. The route engine clamps every value into [0, 1] and combines
them with the profile's weights, so a scorer only states its formula.

- ``ttft``: ``best / cost`` with ``cost = ttft + horizon * future_ttft`` from the cost model
  (this turn's time to first token, plus the session's expected turns to come; 1 for the best).
- ``completion``: the same with the time to the last token.
- ``answer``: ``completion`` for a request whose client waits for the last token (an agent:
  ``policies.awaited``), ``ttft`` for the others; the ``cost`` profile's.
- ``session-affinity``: 1 where the session's cache is warm, else 0 (a tie-breaker).
- ``least-loaded``: ``1 / (1 + load)``, ``load = (running + queued) / parallelism``, parallelism
  being the llama.cpp slot count (1 for engines whose running count already is batch pressure).
- ``kv-headroom``: ``1 - kv_usage`` (0.5 where the engine does not report KV use); the worked
  example of docs/adding-a-policy.md.
- ``round-robin``: 1 for candidate ``sequence mod n``, else 0.
- ``prefer-vllm`` / ``prefer-llamacpp``: 1 for that engine kind, else 0.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

from policies.peers import PEER_SCORERS
from policies.types import Awaited, BackendSnapshot, EngineKind, RequestFeatures
from policies.views import CandidateView

Scorer = Callable[[RequestFeatures, Sequence[CandidateView], int], list[float]]


def load_of(snapshot: BackendSnapshot) -> float:
    """Work in flight per unit of parallelism; 0 when idle."""
    parallelism = max(snapshot.total_slots or 1, 1)
    return (snapshot.running + snapshot.queued) / parallelism


def least_loaded(
    features: RequestFeatures, candidates: Sequence[CandidateView], sequence: int
) -> list[float]:
    return [1.0 / (1.0 + load_of(c.snapshot)) for c in candidates]


def _relative(costs: list[float]) -> list[float]:
    best = min(costs)
    return [best / cost if cost > 0 else 1.0 for cost in costs]


def ttft(features: RequestFeatures, candidates: Sequence[CandidateView], sequence: int) -> list[float]:
    return _relative([c.estimate.objective_ttft_s for c in candidates])


def completion(features: RequestFeatures, candidates: Sequence[CandidateView], sequence: int) -> list[float]:
    return _relative([c.estimate.objective_total_s for c in candidates])


def answer(features: RequestFeatures, candidates: Sequence[CandidateView], sequence: int) -> list[float]:
    """``completion`` where the client waits for the last token (an agent), else ``ttft``."""
    if features.awaited is Awaited.LAST_TOKEN:
        return completion(features, candidates, sequence)
    return ttft(features, candidates, sequence)


def session_affinity(
    features: RequestFeatures, candidates: Sequence[CandidateView], sequence: int
) -> list[float]:
    return [1.0 if c.estimate.warm else 0.0 for c in candidates]


def kv_headroom(features: RequestFeatures, candidates: Sequence[CandidateView], sequence: int) -> list[float]:
    """1 - KV-cache use (vLLM's vllm:kv_cache_usage_perc); engines that do not report it score 0.5."""
    return [1.0 - c.snapshot.kv_usage if c.snapshot.kv_usage is not None else 0.5 for c in candidates]


def round_robin(features: RequestFeatures, candidates: Sequence[CandidateView], sequence: int) -> list[float]:
    turn = sequence % len(candidates)
    return [1.0 if index == turn else 0.0 for index in range(len(candidates))]


def _prefer(kind: EngineKind) -> Scorer:
    def prefer(features: RequestFeatures, candidates: Sequence[CandidateView], sequence: int) -> list[float]:
        return [1.0 if c.snapshot.kind is kind else 0.0 for c in candidates]

    return prefer


SCORERS: dict[str, Scorer] = {
    "ttft": ttft,
    "completion": completion,
    "answer": answer,
    "session-affinity": session_affinity,
    "least-loaded": least_loaded,
    "kv-headroom": kv_headroom,
    "round-robin": round_robin,
    "prefer-vllm": _prefer(EngineKind.VLLM),
    "prefer-llamacpp": _prefer(EngineKind.LLAMACPP),
    **PEER_SCORERS,
}
