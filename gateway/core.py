"""The one builder of the routing core: ``build_core(settings, clock, client=...)`` assembles the
catalog, the fleet, the state store, the router, key limits, metrics and the request lifecycle.

Every front end takes a :class:`Core` from here and nothing else: the HTTP app (``gateway.app``,
inside its lifespan, where the HTTP client lives), the virtual replay (no HTTP: in-process engine
documents on a simulated clock), ``turnout config check`` (``gateway.probe_check``) and the bench
harnesses. So all of them route with the same settings applied the same way.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Mapping
from contextlib import asynccontextmanager
from dataclasses import dataclass
from typing import Any

import httpx

from backends.base import BackendSpec, Documents, Poster
from backends.clock import WALL, Clock
from backends.fleet import Fleet
from backends.transport import AiohttpTransport
from gateway.access import Access, Key
from gateway.catalog import Catalog
from gateway.key_limits import Counter, MemoryCounter
from gateway.key_limits.redis_counter import RedisCounter
from gateway.key_limits.resilient import ResilientCounter
from gateway.lifecycle import Lifecycle
from gateway.metrics import Metrics
from gateway.replicas import Replicas
from gateway.residency import Residency, engine_switches, router_model_of
from gateway.residency_start import check_at_start
from gateway.routing import Router
from gateway.settings import Settings
from gateway.state import MemoryStore, StateStore
from gateway.state.redis_store import RedisStore
from gateway.state.resilient import ResilientStore
from policies import EngineKind


def backend_specs(settings: Settings, catalog: Catalog) -> list[BackendSpec]:
    """What the fleet needs of each configured backend: where it is, its timeouts, its circuit
    breaker, and the deployments the catalog puts on it."""
    return [
        BackendSpec(
            id=b.id,
            kind=b.kind,
            base_url=b.base_url,
            api_key=b.api_key,
            connect_timeout=b.timeouts.connect,
            read_timeout=b.timeouts.read,
            first_byte_timeout=b.timeouts.first_byte,
            stream_idle_timeout=b.timeouts.stream_idle,
            probe_timeout=b.timeouts.probe,
            probe_interval_s=b.probe_interval_s,
            circuit_failures=b.circuit.failures,
            circuit_cool_down_s=b.circuit.cool_down_s,
            circuit_max_cool_down_s=b.circuit.max_cool_down_s,
            deployments=catalog.deployments_on(b.id),
            router_model=router_model_of(settings, b.id)
            if b.kind is EngineKind.LLAMACPP and settings.residency_member(b.id) is not None
            else None,
            sleeps=settings.residency_member(b.id) is not None,
        )
        for b in settings.backends
    ]


def state_store(settings: Settings, clock: Clock = WALL) -> StateStore:
    """Redis when ``state.url`` is set (shared by replicas), else this process's memory; sessions
    expire, and Redis's retries are timed, on ``clock``."""
    state = settings.state
    common: dict[str, Any] = {
        "clock": clock.time,
        "max_sessions": state.max_sessions,
        "session_ttl_s": state.session_ttl_s,
        "max_decisions": state.decision_log_size,
        "prefix_tokens_per_backend": state.prefix_index_tokens,
    }
    if state.url is not None:
        shared = RedisStore(state.url, prefix=state.prefix, timeout_s=state.timeout_s, **common)
        local = MemoryStore(**common, timeline_turns=state.timeline_turns)
        return ResilientStore(shared, local, clock.monotonic)
    return MemoryStore(**common, timeline_turns=state.timeline_turns)


def key_counter(settings: Settings, clock: Clock = WALL) -> Counter:
    """Per-key limits counted in Redis when ``state.url`` is set (shared by replicas), else here; the
    windows are timed on ``clock`` (Redis's on its epoch, this process's on its monotonic time)."""
    url = settings.state.url
    local = MemoryCounter(clock.monotonic)
    if url is not None:
        state = settings.state
        shared = RedisCounter(url, prefix=state.prefix, timeout_s=state.timeout_s, clock=clock.time)
        return ResilientCounter(shared, local, clock.monotonic)
    return local


def one_replica(settings: Settings) -> Settings:
    """``settings`` for one gateway on its own memory, sharing no state with other replicas (a
    config's ``state.url`` is ignored): a replay, a probe check."""
    if settings.state.url is None:
        return settings
    replica: Settings = settings.model_copy(update={"state": settings.state.model_copy(update={"url": None})})
    return replica


def access_of(settings: Settings, clock: Clock = WALL) -> Access:
    """API keys and their limits (``[auth]``)."""
    keys = [
        Key(
            k.name,
            k.digest,
            frozenset(k.models) if k.models is not None else None,
            k.requests_per_minute,
            k.concurrent,
            k.tokens_per_minute,
        )
        for k in settings.auth.all_keys()
    ]
    return Access(keys, key_counter(settings, clock))


@dataclass(frozen=True, slots=True)
class Core:
    """The routing core of one gateway: what every request's lifecycle uses, built once."""

    settings: Settings
    clock: Clock
    catalog: Catalog
    fleet: Fleet
    store: StateStore
    router: Router
    access: Access
    metrics: Metrics
    lifecycle: Lifecycle
    residency: Residency


def build_core(
    settings: Settings,
    clock: Clock = WALL,
    *,
    client: httpx.AsyncClient,
    poster: Poster | None = None,
    documents: Mapping[str, Documents] | None = None,
    record: bool = True,
) -> Core:
    """The core for ``settings`` on ``clock``. ``client`` (and ``poster``, the relay's own transport)
    reach the engines; ``documents``: engines answered in process instead (the virtual replay);
    ``record``: start ``[record]`` when its ``on_start`` says so (a replay never records itself)."""
    catalog = Catalog(
        settings.models,
        created=int(clock.time()),
        profiles=settings.engine_profiles(),
        groups=settings.groups,
    )
    fleet = Fleet(backend_specs(settings, catalog), client, poster=poster, clock=clock, documents=documents)
    store = state_store(settings, clock)
    router = Router(
        fleet,
        store,
        settings.routing_profile(),
        lease_idle_s=settings.state.lease_idle_s,
        group_profiles=settings.group_profiles(),
        redact_session_ids=settings.admin.redact_session_ids,
    )
    if record and settings.record.path is not None and settings.record.on_start:
        router.recorder = settings.record.recorder()
    residency = Residency(
        settings.residency, engine_switches(settings, client, asyncio.sleep, clock), fleet, clock
    )
    router.asleep = residency.asleep
    metrics = Metrics()
    metrics.residency = residency.view
    lifecycle = Lifecycle(fleet, catalog, router, retries=settings.limits.retries, residency=residency)
    return Core(
        settings,
        clock,
        catalog,
        fleet,
        store,
        router,
        access_of(settings, clock),
        metrics,
        lifecycle,
        residency,
    )


UPSTREAM_HEADROOM = 64
"""Connections to the engines beyond ``limits.max_connections``: probes never wait behind requests."""


@asynccontextmanager
async def running_core(settings: Settings, clock: Clock = WALL) -> AsyncIterator[Core]:
    """The core for ``settings``, running: its HTTP client to the engines (httpx's API on aiohttp's
    pool, ``backends.transport``), the engines probed, the other replicas' prefix index records and
    learned state followed; all of it stopped on the way out. The HTTP app (``gateway.app``) and the
    Endpoint Picker (``gateway.epp.server``) run their core this one way."""
    # every client connection may hold one to an engine; probes and token counts get room beside them
    limits = httpx.Limits(max_connections=settings.limits.max_connections + UPSTREAM_HEADROOM)
    transport = AiohttpTransport(limits)
    async with httpx.AsyncClient(limits=limits, timeout=None, transport=transport) as client:
        core = build_core(settings, clock, client=client, poster=transport)
        background = [
            asyncio.create_task(core.store.follow()),  # the other replicas' prefix index records
            asyncio.create_task(Replicas(core.router, core.fleet).run()),  # learned state and load
        ]
        await core.fleet.start()
        check_at_start(core.residency)  # each residency set's engines as its config says
        try:
            yield core
        finally:
            for task in background:
                task.cancel()
            await core.lifecycle.warming.close()
            await core.residency.stop()
            await core.fleet.stop()
            await core.access.close()
            if core.router.recorder is not None:
                core.router.recorder.close()


async def fleet_rows(core: Core) -> list[dict[str, Any]]:
    """Each backend's gauges for ``/metrics`` (``Metrics.exposition``): health, load, slots and their
    leases, drained, its circuit breaker."""
    router, rows = core.router, []
    for snapshot in core.fleet.snapshots():
        leases = await router.store.leases(snapshot.backend_id) if snapshot.slots else ()
        rows.append(
            {
                "backend": snapshot.backend_id,
                "kind": snapshot.kind.value,
                "health": snapshot.health.value,
                "running": snapshot.running,
                "waiting": snapshot.queued,
                "kv_usage": snapshot.kv_usage,
                "drained": snapshot.backend_id in router.drained,
                "slots": len(snapshot.slots),
                "leases": len(leases),
                "circuit": snapshot.circuit,
                "circuit_trips": core.fleet.breakers[snapshot.backend_id].trips,
            }
        )
    return rows
