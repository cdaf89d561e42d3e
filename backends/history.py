"""What the probes saw of each engine's load over the last day, for the dashboard's slot timeline.

Every probe snapshot of a ready engine adds its running and waiting requests (the engine's own
counts, not turnout's overlay) to a bucket of :data:`BUCKET_S` seconds, which keeps the most of each;
a backend keeps the newest :data:`KEPT_S` seconds of buckets (8,640 of them: ~0.4 MB per backend at
most). Each replica probes every engine, so each keeps the same history by itself.
"""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass

from policies.types import BackendSnapshot, EngineKind, Health

BUCKET_S = 10.0
KEPT_S = 24 * 3600.0


@dataclass(slots=True)
class Bucket:
    start: float
    running: int
    queued: int


class LoadHistory:
    def __init__(self, bucket_s: float = BUCKET_S, kept_s: float = KEPT_S) -> None:
        self.bucket_s = bucket_s
        self._kept = int(kept_s / bucket_s)
        self._buckets: dict[str, deque[Bucket]] = {}

    def add(self, snapshot: BackendSnapshot) -> None:
        """Count one probe (an engine that is not ready, or reports no load, adds nothing)."""
        if snapshot.health is not Health.READY or snapshot.kind is EngineKind.OPENAI:
            return
        start = snapshot.taken_at // self.bucket_s * self.bucket_s
        buckets = self._buckets.setdefault(snapshot.backend_id, deque(maxlen=self._kept))
        if buckets and buckets[-1].start == start:
            last = buckets[-1]
            last.running = max(last.running, snapshot.running)
            last.queued = max(last.queued, snapshot.queued)
        elif not buckets or buckets[-1].start < start:  # a clock that went back adds nothing
            buckets.append(Bucket(start, snapshot.running, snapshot.queued))

    def since(self, backend_id: str, since: float) -> list[Bucket]:
        """The buckets of ``backend_id`` that end after ``since``, oldest first."""
        return [b for b in self._buckets.get(backend_id, ()) if b.start + self.bucket_s > since]
