"""Scorers: soft preferences, each a value in [0, 1] per candidate (higher is better).

The route engine clamps every value into [0, 1] and combines them with the profile's weights, so
a scorer only states its formula.

- ``least-loaded``: ``1 / (1 + load)`` where ``load = (running + queued) / parallelism`` and
  parallelism is the llama.cpp slot count (or 1 for engines without slots, whose running count
  already measures batch pressure). An idle backend scores 1.
"""

from __future__ import annotations

from collections.abc import Callable

from policies.types import BackendSnapshot, Deployment, RequestFeatures

Scorer = Callable[[RequestFeatures, Deployment, BackendSnapshot], float]


def load_of(snapshot: BackendSnapshot) -> float:
    """Work in flight per unit of parallelism; 0 when idle."""
    parallelism = max(snapshot.total_slots or 1, 1)
    return (snapshot.running + snapshot.queued) / parallelism


def least_loaded(features: RequestFeatures, deployment: Deployment, snapshot: BackendSnapshot) -> float:
    return 1.0 / (1.0 + load_of(snapshot))


SCORERS: dict[str, Scorer] = {
    "least-loaded": least_loaded,
}
