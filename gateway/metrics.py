"""Prometheus metrics (``GET /metrics``): what turnout routed, how it went, and the fleet as it sees it.

Per request (observed once, when its log line is written): requests by model, backend, endpoint,
status and route reason; TTFT and duration histograms per backend; the TTFT prediction error
(actual - predicted); prompt, cached and completion tokens; retries; client disconnects. At scrape
time (a collector reading the latest probes and the state store): backend health and load, drained
backends, llama.cpp slot leases in use; the garbage collector's pauses (``gateway.gc_pauses``).
Names and labels are documented in docs/metrics.md.

Each gateway has its own registry (tests start many in one process); label values are bounded:
models and backends come from the config, reasons from ``policies.Reason``.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from typing import Any

from prometheus_client import CollectorRegistry, Counter, Histogram, generate_latest
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily
from prometheus_client.registry import Collector

from gateway.gc_pauses import PAUSES, GcCollector
from gateway.record import RequestRecord
from policies import Endpoint

CONTENT_TYPE = "text/plain; version=0.0.4; charset=utf-8"
SECONDS = (0.05, 0.1, 0.25, 0.5, 1.0, 2.0, 4.0, 8.0, 15.0, 30.0, 60.0, 120.0, 300.0)
ERROR_SECONDS = (-30.0, -10.0, -4.0, -2.0, -1.0, -0.5, -0.2, 0.0, 0.2, 0.5, 1.0, 2.0, 4.0, 10.0, 30.0)
CLIENT_CLOSED = 499


class FleetCollector(Collector):
    """Gauges read at scrape time: ``snapshot()`` returns the rows to expose."""

    def __init__(self, snapshot: Callable[[], list[dict[str, Any]]]) -> None:
        self._snapshot = snapshot

    def collect(self) -> Iterator[GaugeMetricFamily | CounterMetricFamily]:
        def gauge(name: str, text: str, *labels: str) -> GaugeMetricFamily:
            return GaugeMetricFamily(name, text, labels=["backend", *labels])

        up = gauge("turnout_backend_up", "1 if the backend's last probe found it ready", "kind")
        health = gauge("turnout_backend_health", "1 for the backend's current health state", "state")
        running = gauge("turnout_backend_requests_running", "Requests running there (engine's and turnout's)")
        waiting = gauge("turnout_backend_requests_waiting", "Requests queued on the backend")
        kv = gauge("turnout_backend_kv_usage_ratio", "vLLM KV cache use, 0-1")
        drained = gauge("turnout_backend_drained", "1 if an admin drained the backend")
        circuit = gauge("turnout_backend_circuit", "1 for the backend's circuit breaker state", "state")
        trips = CounterMetricFamily(
            "turnout_backend_circuit_trips", "Times the backend's circuit opened", labels=["backend"]
        )
        leases = gauge("turnout_slot_leases", "llama.cpp slots held by a session")
        slots = gauge("turnout_slots", "llama.cpp slots of the backend")
        for row in self._snapshot():
            backend = row["backend"]
            up.add_metric([backend, row["kind"]], 1.0 if row["health"] == "ready" else 0.0)
            for state in ("unknown", "loading", "ready", "down"):
                health.add_metric([backend, state], 1.0 if row["health"] == state else 0.0)
            running.add_metric([backend], row["running"])
            waiting.add_metric([backend], row["waiting"])
            if row["kv_usage"] is not None:
                kv.add_metric([backend], row["kv_usage"])
            drained.add_metric([backend], 1.0 if row["drained"] else 0.0)
            for state in ("closed", "open", "half-open"):
                circuit.add_metric([backend, state], 1.0 if row["circuit"] == state else 0.0)
            trips.add_metric([backend], row["circuit_trips"])
            if row["slots"]:
                leases.add_metric([backend], row["leases"])
                slots.add_metric([backend], row["slots"])
        yield from (up, health, running, waiting, kv, drained, circuit, trips, leases, slots)


class ResidencyCollector(Collector):
    """The residency sets at scrape time (``gateway.residency.Residency.view``): which member holds
    the GPUs, whether a switch runs, and the switches made by how they ended."""

    def __init__(self, sets: Callable[[], list[dict[str, Any]]]) -> None:
        self._sets = sets

    def collect(self) -> Iterator[GaugeMetricFamily | CounterMetricFamily]:
        awake = GaugeMetricFamily(
            "turnout_residency_awake", "1 for the member that holds the set's GPUs", labels=["set", "backend"]
        )
        switching = GaugeMetricFamily(
            "turnout_residency_switching", "1 while a switch of the set runs", labels=["set"]
        )
        switches = CounterMetricFamily(
            "turnout_residency_switches", "Switches of the set by how they ended", labels=["set", "result"]
        )
        for one in self._sets():
            for member in one["members"]:
                awake.add_metric([one["name"], member], 1.0 if member == one["awake"] else 0.0)
            switching.add_metric([one["name"]], 0.0 if one["switch"] is None else 1.0)
            for result, count in one["counts"].items():
                switches.add_metric([one["name"], result], count)
        yield from (awake, switching, switches)


class Metrics:
    def __init__(self) -> None:
        self.registry = CollectorRegistry(auto_describe=True)
        self._rows: list[dict[str, Any]] = []
        labels = ["model", "backend", "endpoint", "status", "reason"]
        self.requests = Counter("turnout_requests", "Requests answered", labels, registry=self.registry)
        self.ttft = Histogram(
            "turnout_ttft_seconds", "Time to the engine's first token (streamed, or from its timings)",
            ["backend"], buckets=SECONDS, registry=self.registry,
        )  # fmt: skip
        self.duration = Histogram(
            "turnout_request_duration_seconds", "Whole request, as the client saw it", ["backend"],
            buckets=SECONDS, registry=self.registry,
        )  # fmt: skip
        self.ttft_error = Histogram(
            "turnout_ttft_prediction_error_seconds", "Actual minus predicted TTFT of the chosen backend",
            ["backend"], buckets=ERROR_SECONDS, registry=self.registry,
        )  # fmt: skip
        self.tokens = Counter(
            "turnout_tokens", "Prompt, cached (reused) and completion tokens", ["backend", "kind"],
            registry=self.registry,
        )  # fmt: skip
        self.retries = Counter(
            "turnout_retries", "Re-routes after a backend failed before its first byte", ["endpoint"],
            registry=self.registry,
        )  # fmt: skip
        self.disconnects = Counter(
            "turnout_client_disconnects", "Clients that left before their answer ended", ["endpoint"],
            registry=self.registry,
        )  # fmt: skip
        for endpoint in Endpoint:  # present (at 0) from the start, so dashboards find them
            self.retries.labels(endpoint.value)
            self.disconnects.labels(endpoint.value)
        self.registry.register(FleetCollector(lambda: self._rows))
        self.residency: Callable[[], list[dict[str, Any]]] = list
        """The residency sets' view (``gateway.core`` sets it)."""
        self.registry.register(ResidencyCollector(lambda: self.residency()))
        self.residency_wait = Histogram(
            "turnout_residency_wait_seconds", "What requests waited for a switch to wake their backend",
            buckets=SECONDS, registry=self.registry,
        )  # fmt: skip
        PAUSES.install()
        self.registry.register(GcCollector())

    def observe(self, record: RequestRecord, duration_s: float) -> None:
        """One finished request (``RequestRecord.observer``)."""
        backend = record.backend or "none"
        reason = (record.reason or "none").split(";", 1)[0]
        self.requests.labels(
            record.model or "unknown", backend, record.endpoint, str(record.status), reason
        ).inc()
        self.duration.labels(backend).observe(duration_s)
        ttft = record.ttft_s
        if ttft is not None:
            self.ttft.labels(backend).observe(ttft)
            if record.predicted_ttft is not None:
                self.ttft_error.labels(backend).observe(ttft - record.predicted_ttft)
        if record.usage is not None:
            self.tokens.labels(backend, "prompt").inc(record.usage.prompt_tokens)
            self.tokens.labels(backend, "cached").inc(record.usage.cached_tokens or 0)
            self.tokens.labels(backend, "completion").inc(record.usage.completion_tokens)
        if record.residency_wait_s is not None:
            self.residency_wait.observe(record.residency_wait_s)
        if record.retries:
            self.retries.labels(record.endpoint).inc(record.retries)
        if record.status == CLIENT_CLOSED:
            self.disconnects.labels(record.endpoint).inc()

    def exposition(self, fleet: list[dict[str, Any]]) -> bytes:
        """The text format, with ``fleet`` (one row per backend, read just now) as the gauges."""
        self._rows = fleet
        return generate_latest(self.registry)
