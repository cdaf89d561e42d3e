"""How long the cyclic garbage collector stops the gateway, per generation (``gc.callbacks``).

A collection stops every request and stream the process serves; a full one (generation 2) walks
every container object alive, so its pause grows with what the gateway holds (thousands of open
streams). :data:`PAUSES` is the one record per process (the collector is one per process, while
tests run many gateways); each gateway's ``/metrics`` exposes it as ``turnout_gc_pause_seconds``.
The callback costs two clock reads per collection.
"""

from __future__ import annotations

import bisect
import gc
import time
from collections.abc import Iterator
from typing import Any

from prometheus_client.core import HistogramMetricFamily
from prometheus_client.registry import Collector

BUCKETS = (0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0)
GENERATIONS = (0, 1, 2)


class GcPauses:
    """Per generation: how many collections fell in each of :data:`BUCKETS` (and above), their sum."""

    def __init__(self) -> None:
        self.counts = {g: [0] * (len(BUCKETS) + 1) for g in GENERATIONS}
        self.sums = dict.fromkeys(GENERATIONS, 0.0)
        self._started = 0.0
        self._installed = False

    def install(self) -> None:
        """Start timing collections (once per process; again is a no-op)."""
        if not self._installed:
            gc.callbacks.append(self._callback)
            self._installed = True

    def _callback(self, phase: str, info: dict[str, Any]) -> None:
        if phase == "start":
            self._started = time.perf_counter()
            return
        pause, generation = time.perf_counter() - self._started, info["generation"]
        self.counts[generation][bisect.bisect_left(BUCKETS, pause)] += 1
        self.sums[generation] += pause


PAUSES = GcPauses()


class GcCollector(Collector):
    """``turnout_gc_pause_seconds{generation}``, a histogram read from :data:`PAUSES` at scrape time."""

    def __init__(self, pauses: GcPauses = PAUSES) -> None:
        self._pauses = pauses

    def collect(self) -> Iterator[HistogramMetricFamily]:
        family = HistogramMetricFamily(
            "turnout_gc_pause_seconds", "Garbage collector pauses, per generation", labels=["generation"]
        )
        for generation in GENERATIONS:
            running, buckets = 0, []
            for bound, count in zip(
                (*map(str, BUCKETS), "+Inf"), self._pauses.counts[generation], strict=True
            ):
                running += count
                buckets.append((bound, float(running)))
            family.add_metric([str(generation)], buckets, self._pauses.sums[generation])
        yield family
