"""The fleet: every configured backend's adapter, and a probe loop keeping their snapshots fresh.

``snapshots()`` is what routing reads: a tuple of the latest immutable snapshots, in configured
order, swapped whole by the probe tasks (no locks, no partial views).
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Mapping, Sequence

import httpx
import structlog
from msgspec.structs import replace

from backends.base import Adapter, BackendSpec, Documents, Poster
from backends.breaker import Breaker
from backends.clock import WALL, Clock
from backends.history import LoadHistory
from backends.inflight import InFlight
from backends.load import Load, Own
from backends.registry import create_adapter
from backends.sent import Sent
from backends.watchdog import Watchdog
from policies.types import BackendSnapshot, EngineKind, Health

log = structlog.get_logger(__name__)


def restarted(before: BackendSnapshot, now: BackendSnapshot, was_ready: bool) -> str | None:
    """Why a backend probed ready ``now`` holds nothing of what it held ``before``, if it does: its
    work counter went back (it restarted between two probes), or it is back after being down or
    loading (it may have restarted; forgetting costs a cold turn, trusting a restarted engine's empty
    slots costs every session's next turn its estimate)."""
    if before.work_done is not None and now.work_done is not None and now.work_done < before.work_done:
        return f"its work counter went back ({before.work_done:g} -> {now.work_done:g})"
    if was_ready and before.health in (Health.DOWN, Health.LOADING):
        return f"back after being {before.health.value}"
    return None


class Fleet:
    """Adapters by backend id, their latest snapshots, and the probe tasks."""

    def __init__(
        self,
        specs: Sequence[BackendSpec],
        client: httpx.AsyncClient,
        poster: Poster | None = None,
        clock: Clock = WALL,
        documents: Mapping[str, Documents] | None = None,
    ) -> None:
        """``poster`` sends inference requests (the gateway's aiohttp transport); else ``client``.
        ``clock`` stamps the probes and the requests in flight (``time()``, what the in-flight
        predictions are measured against) and times the breakers and watchdogs (``monotonic()``).
        ``documents``: backends probed in this process instead of over HTTP (``Documents``)."""
        self.clock = clock
        self.adapters: dict[str, Adapter] = {
            spec.id: create_adapter(spec, client, poster, clock, (documents or {}).get(spec.id))
            for spec in specs
        }
        self._snapshots: dict[str, BackendSnapshot] = {
            spec.id: BackendSnapshot(spec.id, spec.kind, Health.UNKNOWN, 0.0, spec.deployments)
            for spec in specs
        }
        self._view: tuple[BackendSnapshot, ...] = tuple(self._snapshots.values())
        self._tasks: list[asyncio.Task[None]] = []
        self._inflight = InFlight()
        self.generations: dict[str, int] = {spec.id: 0 for spec in specs}
        """Per backend, how many times it was seen to restart: whoever remembers what an engine holds
        (slot leases, the prefix index) forgets it when this moves (``restarted``)."""
        self._was_ready: dict[str, bool] = {}
        self._resuming: set[str] = set()  # back with what it held restored (``resume``)
        self.log_health = True
        """Log each backend's change of health (``turnout config check`` prints its own table instead)."""
        self.breakers: dict[str, Breaker] = {
            spec.id: Breaker(
                spec.circuit_failures, spec.circuit_cool_down_s, spec.circuit_max_cool_down_s, clock.monotonic
            )
            for spec in specs
        }
        """Per backend, whether its answers are any good (``backends.breaker``)."""
        self.peers: dict[str, Load] = {}
        """The other replicas' requests in flight, per backend (``gateway.replicas`` sets it)."""
        self.history = LoadHistory()
        """What the probes saw of each engine's load over the last day (the slot timeline's vLLM lane)."""

    def snapshots(self) -> tuple[BackendSnapshot, ...]:
        """The latest snapshots, with turnout's own requests in flight laid over them
        (``backends.inflight``: fresh load between probes, predicted slot waits, prefill backlog)."""
        tripped = [b for b, breaker in self.breakers.items() if breaker.open_until is not None]
        if not self._inflight and not self.peers and not tripped:
            return self._view
        now = self.clock.time()
        view = tuple(
            self._inflight.overlay(snapshot, now, self.peers.get(snapshot.backend_id))
            for snapshot in self._view
        )
        return tuple(self._circuit(s) if s.backend_id in tripped else s for s in view) if tripped else view

    def _circuit(self, snapshot: BackendSnapshot) -> BackendSnapshot:
        breaker = self.breakers[snapshot.backend_id]
        return replace(
            snapshot,
            circuit=breaker.state.value,
            circuit_blocks=not breaker.allows(),
            error=snapshot.error or breaker.last_error,
        )

    def judge(self, backend_id: str, failure: str | None) -> None:
        """What a request showed of the engine: ``None``, it answered; else how it failed (the
        engine's fault, not the request's). Three failures in a row open its circuit."""
        breaker = self.breakers[backend_id]
        if failure is None:
            if breaker.open_until is not None:
                log.info("circuit.closed", backend=backend_id)
            breaker.succeeded()
        elif breaker.failed(failure):
            log.warning("circuit.opened", backend=backend_id, cool_down_s=breaker.cool_down_s, error=failure)

    def load(self) -> dict[str, Load]:
        """This replica's requests in flight per backend (for the other replicas)."""
        return self._inflight.load(self.clock.time())

    def begin(self, request: Sent) -> int:
        """Note a request sent (with routing's predictions); returns the token :meth:`end` takes."""
        self.breakers[request.backend_id].sent()
        return self._inflight.begin(request)

    def own(self, backend_id: str) -> Own:
        """This gateway's own requests open on ``backend_id`` (``InFlight.own``)."""
        return self._inflight.own(backend_id)

    def prefilled(self, token: int, *, seen: bool = True) -> None:
        """The request's first token arrived (its prompt is processed); ``seen`` False: its prompt
        left the engine without one (``InFlight.prefilled``)."""
        self._inflight.prefilled(token, self.clock.time(), seen=seen)

    def end(self, token: int) -> bool:
        """The request ended (after :meth:`judge`, if it showed anything of the engine); returns
        whether a background warm-up's prompt processing overlapped its own (``InFlight.shared``)."""
        shared = self._inflight.shared(token)
        backend = self._inflight.end(token, self.clock.time())
        if backend is not None:
            self.breakers[backend].ended()
        return shared

    def watchdog(self, backend_id: str) -> Watchdog:
        """Deadlines for one request to ``backend_id`` (``backends.watchdog``), judged by what the
        probes last saw of the engine."""
        spec = self.adapters[backend_id].spec
        sent = self.clock.time()
        return Watchdog(
            lambda: self.liveness(backend_id, since=sent),
            first_byte_s=spec.first_byte_timeout,
            longest_s=spec.read_timeout,
            idle_s=spec.stream_idle_timeout,
            clock=self.clock.monotonic,
        )

    def liveness(self, backend_id: str, since: float = 0.0) -> bool | None:
        """What the engine itself last reported (not turnout's own requests laid over it): None when
        it is down, else whether it runs or queues requests. An engine that reports no load (a generic
        OpenAI-compatible server) or was not probed yet is taken to be working, and so is one whose
        last probe was taken before ``since`` (the request was sent): a probe that predates the
        request cannot show it, so its "nothing running" is no sign of a hang (a busy gateway's
        probes lag; a request taken for hung on such a probe was cut off while the engine worked)."""
        snapshot = self._snapshots[backend_id]
        if snapshot.health is Health.DOWN:
            return None
        if snapshot.kind is EngineKind.OPENAI or snapshot.health is Health.UNKNOWN:
            return True
        if snapshot.taken_at < since:
            return True
        return snapshot.running + snapshot.queued > 0

    def adapter(self, backend_id: str) -> Adapter:
        return self.adapters[backend_id]

    def observe(self, snapshot: BackendSnapshot) -> None:
        """Take in a probe's snapshot (the probe loop's, or a virtual-time replay's)."""
        previous = self._snapshots.get(snapshot.backend_id)
        if self.log_health and (previous is None or previous.health != snapshot.health):
            log.info(
                "backend.health", backend=snapshot.backend_id, health=snapshot.health, error=snapshot.error
            )
        if previous is not None and snapshot.health is Health.READY:
            why = restarted(previous, snapshot, self._was_ready.get(snapshot.backend_id, False))
            if why and snapshot.backend_id in self._resuming:
                log.info("backend.resumed", backend=snapshot.backend_id, note="its slots were restored")
                why = None
            self._resuming.discard(snapshot.backend_id)
            if why:
                self.generations[snapshot.backend_id] += 1
                log.warning("backend.restarted", backend=snapshot.backend_id, why=why)
            self._was_ready[snapshot.backend_id] = True
        if snapshot.work_done is None and previous is not None and snapshot.health is not Health.READY:
            snapshot = replace(snapshot, work_done=previous.work_done)  # to compare with when it is back
        self._snapshots[snapshot.backend_id] = snapshot
        self._view = tuple(self._snapshots.values())
        self._inflight.seen(snapshot)
        self.history.add(snapshot)

    def forget(self, backend_id: str, why: str) -> None:
        """The engine lost what it held without restarting (a vLLM sleep empties its prefix cache):
        whoever remembers it forgets, as after a restart (``generations``)."""
        self.generations[backend_id] += 1
        log.info("backend.emptied", backend=backend_id, why=why)

    def resume(self, backend_id: str) -> None:
        """The engine comes back holding what it held (a llama-server model reloaded with its slots
        restored): the next ready probe is not taken as a restart, whatever its counters say."""
        self._resuming.add(backend_id)

    def report_failure(self, backend_id: str, error: str) -> None:
        """A request found the backend unreachable: route around it until the next probe says otherwise."""
        current = self._snapshots[backend_id]
        self.observe(replace(current, health=Health.DOWN, taken_at=self.clock.time(), error=error))

    async def probe_all(self) -> tuple[BackendSnapshot, ...]:
        """Probe every backend once, concurrently, and store the results."""
        results = await asyncio.gather(*(adapter.probe() for adapter in self.adapters.values()))
        for snapshot in results:
            self.observe(snapshot)
        return self._view

    async def _loop(self, adapter: Adapter) -> None:
        while True:
            await asyncio.sleep(adapter.spec.probe_interval_s)
            self.observe(await adapter.probe())

    async def start(self) -> None:
        """Probe once (so routing starts with real snapshots), then keep probing in the background."""
        await self.probe_all()
        self._tasks = [
            asyncio.create_task(self._loop(a), name=f"probe-{a.spec.id}") for a in self.adapters.values()
        ]

    async def stop(self) -> None:
        for task in self._tasks:
            task.cancel()
        for task in self._tasks:
            with contextlib.suppress(asyncio.CancelledError):
                await task
        self._tasks = []
