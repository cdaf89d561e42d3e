"""Fallback endpoints (``turnout epp --fallbacks N``): which engines can take the primary's very
request, in what order; then through a real Envoy running deploy/envoy/envoy-fallbacks.yaml, a
primary that refuses connections is stepped over to the fallback the picker named, and never to one
it did not name; the circuit breakers judge the engine that answered, not the one predicted."""

from __future__ import annotations

import json
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx
import pytest

from backends.sim import SimConfig, create_sim_app
from gateway.epp.endpoints import EndpointEntry, with_endpoints
from gateway.epp.exchange import endpoint_address
from gateway.epp.fallbacks import fallbacks
from gateway.settings import Settings
from policies import BackendSnapshot, Decision, Health
from policies.decision import Estimate, ScoredCandidate
from policies.types import Deployment, EngineKind, Reason
from tests.e2e.conftest import Tap, stack_settings
from tests.epp.envoy import Envoy, PickerThread
from tests.servers import ServerThread


@dataclass
class Spec:
    base_url: str
    api_key: str | None = None


@dataclass
class FakeAdapter:
    kind: EngineKind
    spec: Spec = field(default_factory=lambda: Spec("http://127.0.0.1:1"))


ADAPTERS = {
    "vllm-a": FakeAdapter(EngineKind.VLLM, Spec("http://10.0.0.1:8000")),
    "vllm-b": FakeAdapter(EngineKind.VLLM, Spec("http://10.0.0.2:8000")),
    "vllm-c": FakeAdapter(EngineKind.VLLM, Spec("http://10.0.0.3:8000")),
    "vllm-keyed": FakeAdapter(EngineKind.VLLM, Spec("http://10.0.0.4:8000", api_key="other")),
    "llama-a": FakeAdapter(EngineKind.LLAMACPP, Spec("http://10.0.1.1:8080")),
    "llama-b": FakeAdapter(EngineKind.LLAMACPP, Spec("http://10.0.1.2:8080")),
    "llama-small": FakeAdapter(EngineKind.LLAMACPP, Spec("http://10.0.1.3:8080")),
}
SNAPSHOTS = tuple(
    BackendSnapshot(name, adapter.kind, Health.READY, 0.0, total_slots={"llama-small": 1}.get(name, 2))
    for name, adapter in ADAPTERS.items()
)


def candidate(backend: str, score: float, upstream: str = "up", slot: int | None = None) -> ScoredCandidate:
    estimate = Estimate(0, 0.0, 1.0, 1.0, slot=slot)
    return ScoredCandidate(Deployment("m", backend, upstream), score, estimate=estimate)


def decide(*candidates: ScoredCandidate) -> Decision:
    return Decision("cost", candidates[0].deployment, Reason.LEAST_LOADED, candidates)


def named(decision: Decision, limit: int = 8, allowed: Any = lambda adapter: True) -> list[str]:
    return fallbacks(decision, ADAPTERS.__getitem__, SNAPSHOTS, allowed, limit)  # type: ignore[arg-type]


def test_fallbacks_are_engines_that_take_the_same_request_best_score_first() -> None:
    decision = decide(
        candidate("vllm-a", 9.0),
        candidate("vllm-c", 1.0),
        candidate("llama-a", 8.0),  # another engine kind: the body is vLLM's
        candidate("vllm-keyed", 7.0),  # another key: the auth header is vllm-a's
        candidate("vllm-b", 5.0),
    )
    assert named(decision) == ["vllm-b", "vllm-c"]
    assert named(decision, limit=1) == ["vllm-b"]
    assert named(decision, limit=0) == []


def test_a_fallback_serves_the_model_under_the_same_upstream_name() -> None:
    decision = decide(candidate("vllm-a", 9.0), candidate("vllm-b", 5.0, upstream="another-name"))
    assert named(decision) == []


def test_a_pinned_slot_must_exist_on_the_fallback() -> None:
    decision = decide(
        candidate("llama-a", 9.0, slot=1), candidate("llama-small", 6.0, slot=0), candidate("llama-b", 5.0)
    )
    assert named(decision) == ["llama-b"]  # llama-small has slot 0 only


def test_the_subset_hint_bounds_the_fallbacks_too() -> None:
    decision = decide(candidate("vllm-a", 9.0), candidate("vllm-b", 5.0), candidate("vllm-c", 1.0))
    assert named(decision, allowed=lambda adapter: adapter.spec.base_url.endswith("3:8000")) == ["vllm-c"]


def test_no_decision_no_fallbacks() -> None:
    assert named(Decision("cost", None, Reason.LEAST_LOADED)) == []


# --- through Envoy -------------------------------------------------------------------------------


class Failing:
    """ASGI wrapper: while ``failing``, every inference POST is answered 500 (an engine's own error)."""

    def __init__(self, app: Any) -> None:
        self.app, self.failing = app, False

    async def __call__(self, scope: Any, receive: Any, send: Any) -> None:
        if not (self.failing and scope["type"] == "http" and scope["path"].startswith("/v1/")):
            await self.app(scope, receive, send)
            return
        body = json.dumps({"error": {"message": "engine broke", "type": "internal_error"}}).encode()
        headers = [(b"content-type", b"application/json")]
        await send({"type": "http.response.start", "status": 500, "headers": headers})
        await send({"type": "http.response.body", "body": body})


@dataclass
class Replicas:
    envoy: Envoy
    picker: PickerThread
    taps: dict[str, Tap]
    servers: dict[str, ServerThread]
    failing: dict[str, Failing]

    def failures(self, backend: str) -> int:
        """The picker's circuit breaker's count of ``backend``'s failures in a row."""
        return int(self.picker.core.fleet.breakers[backend].failures)


def replica_settings(urls: dict[str, str]) -> Settings:
    """The e2e stack's two backends, vLLM replicated as ``vllm-a`` and ``vllm-b`` (an endpoints file's
    label), probed rarely: a replica that dies stays healthy to the picker for the test's length."""
    settings = stack_settings({"vllm": "http://127.0.0.1:1", "llama": urls["llama"]})
    entries = [
        EndpointEntry(name, "127.0.0.1", urls[name].rsplit(":", 1)[1], labels={"turnout.dev/backend": "vllm"})
        for name in ("vllm-a", "vllm-b")
    ]
    settings = with_endpoints(settings, entries)
    backends = tuple(b.model_copy(update={"probe_interval_s": 60.0}) for b in settings.backends)
    return settings.model_copy(update={"backends": backends})


@pytest.fixture(params=[1, 0], ids=["fallbacks-1", "no-fallbacks"])
def replicas(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[Replicas]:
    configs = {
        "vllm-a": SimConfig(kind="vllm", model="up-vllm", time_scale=0.002),
        "vllm-b": SimConfig(kind="vllm", model="up-vllm", time_scale=0.002),
        "llama": SimConfig(kind="llamacpp", model="up-llama", time_scale=0.002, slots=2),
    }
    failing = {name: Failing(create_sim_app(config)) for name, config in configs.items()}
    taps = {name: Tap(app) for name, app in failing.items()}
    servers = {name: ServerThread(tap).start() for name, tap in taps.items()}
    urls = {name: server.url for name, server in servers.items()}
    picker = PickerThread(replica_settings(urls), fallbacks=request.param).start()
    engines = [endpoint_address(url) for url in urls.values()]
    envoy = Envoy(tmp_path, picker.port, engines=engines).start()
    try:
        envoy.picker_healthy()
        yield Replicas(envoy, picker, taps, servers, failing)
    finally:
        envoy.stop()
        picker.stop()
        for server in servers.values():
            server.stop()


def ask(model: str) -> dict[str, Any]:
    return {"model": model, "messages": [{"role": "user", "content": "hello"}], "max_tokens": 8}


def primary_stopped(replicas: Replicas, client: httpx.Client) -> tuple[str, str]:
    """The replica the picker chose for a first request, stopped (it refuses connections now; the
    picker's probe has not seen it), and the other one."""
    first = client.post("/v1/chat/completions", json=ask("m-vllm"))
    assert first.status_code == 200, first.text
    primary = first.headers["x-turnout-backend"]
    replicas.servers[primary].stop()
    return primary, next(name for name in ("vllm-a", "vllm-b") if name != primary)


def test_a_primary_that_refuses_connections_falls_back_to_the_named_replica(replicas: Replicas) -> None:
    with httpx.Client(base_url=replicas.envoy.url, timeout=30) as client:
        primary, other = primary_stopped(replicas, client)
        answered = client.post("/v1/chat/completions", json=ask("m-vllm"))
        if replicas.picker.fallbacks == 0:
            assert answered.status_code == 503  # Envoy's own: one endpoint named, and it refused
            return
        assert answered.status_code == 200, answered.text
        assert answered.headers["x-turnout-backend"] == other
        assert answered.headers["x-turnout-fallback-from"] == primary
        assert answered.json()["model"] == "m-vllm"  # the relay's rewrites still applied
        sent = json.loads(replicas.taps[other].requests[-1])
        assert sent["model"] == "up-vllm"  # the very request prepared for the primary
    # the primary failed once, and the fallback's answer does not clear it: it was not the primary's
    assert replicas.failures(primary) == 1
    assert replicas.failures(other) == 0


@pytest.mark.parametrize("replicas", [1], indirect=True, ids=["fallbacks-1"])
def test_a_fallbacks_own_error_is_judged_against_the_fallback(replicas: Replicas) -> None:
    with httpx.Client(base_url=replicas.envoy.url, timeout=30) as client:
        primary, other = primary_stopped(replicas, client)
        replicas.failing[other].failing = True
        answered = client.post("/v1/chat/completions", json=ask("m-vllm"))
    assert answered.status_code == 500, answered.text
    assert answered.json()["error"]["message"] == "engine broke"  # the engine's own body, untouched
    assert answered.headers["x-turnout-backend"] == other
    assert answered.headers["x-turnout-fallback-from"] == primary
    assert replicas.failures(other) == 1  # its 500 is its own
    assert replicas.failures(primary) == 1  # refused the connection: the fall-back itself, counted once


def test_no_compatible_fallback_no_retry_elsewhere(replicas: Replicas) -> None:
    """The llama.cpp backend has no replica: the picker names none and allows no retry, so Envoy's
    fallback policy never sends llama.cpp's request to a vLLM engine."""
    with httpx.Client(base_url=replicas.envoy.url, timeout=30) as client:
        warm = client.post("/v1/chat/completions", json=ask("m-llama"))
        assert warm.status_code == 200, warm.text
        replicas.servers["llama"].stop()
        answered = client.post("/v1/chat/completions", json=ask("m-llama"))
    assert answered.status_code == 503
    for name in ("vllm-a", "vllm-b"):
        assert not any(json.loads(body).get("model") == "up-llama" for body in replicas.taps[name].requests)


@pytest.mark.parametrize("replicas", [0], indirect=True, ids=["no-fallbacks"])
def test_envoy_opens_a_connection_per_request_to_the_engines(replicas: Replicas) -> None:
    """As with deploy/envoy/envoy.yaml (test_envoy_picker): no engine connection is reused, so no
    request goes down one llama-server closed after a streamed answer."""
    counter = "cluster.engines.upstream_cx_max_requests"
    before = replicas.envoy.counter(counter)
    with httpx.Client(base_url=replicas.envoy.url, timeout=30) as client:
        for model in ("m-vllm", "m-llama"):
            answered = client.post("/v1/chat/completions", json=ask(model))
            assert answered.status_code == 200, answered.text
    assert replicas.envoy.counter_after(counter, before + 1) == before + 2
