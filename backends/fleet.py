"""The fleet: every configured backend's adapter, and a probe loop keeping their snapshots fresh.

``snapshots()`` is what routing reads: a tuple of the latest immutable snapshots, in configured
order, swapped whole by the probe tasks (no locks, no partial views).
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import time
from collections.abc import Sequence
from dataclasses import replace

import httpx
import structlog

from backends.base import Adapter, BackendSpec
from backends.registry import create_adapter
from policies.types import BackendSnapshot, Health

log = structlog.get_logger(__name__)
OPEN_REQUEST_HORIZON_S = 3600.0


class Fleet:
    """Adapters by backend id, their latest snapshots, and the probe tasks."""

    def __init__(self, specs: Sequence[BackendSpec], client: httpx.AsyncClient) -> None:
        self.adapters: dict[str, Adapter] = {spec.id: create_adapter(spec, client) for spec in specs}
        self._snapshots: dict[str, BackendSnapshot] = {
            spec.id: BackendSnapshot(spec.id, spec.kind, Health.UNKNOWN, 0.0, spec.deployments)
            for spec in specs
        }
        self._view: tuple[BackendSnapshot, ...] = tuple(self._snapshots.values())
        self._tasks: list[asyncio.Task[None]] = []
        self._open: dict[int, tuple[str, int | None, float]] = {}
        self._tokens = itertools.count()

    def snapshots(self) -> tuple[BackendSnapshot, ...]:
        """The latest snapshots, plus the requests turnout itself sent since each was taken.

        A probe is up to ``probe_interval_s`` old; a burst routed on it alone would all pick the
        backend that looked idle. Requests begun after a snapshot count as running there (and their
        llama.cpp slots as busy) until the next probe sees them itself.
        """
        if not self._open:
            return self._view
        return tuple(self._with_open_requests(snapshot) for snapshot in self._view)

    def _with_open_requests(self, snapshot: BackendSnapshot) -> BackendSnapshot:
        newer = [
            slot for backend, slot, started in self._open.values()
            if backend == snapshot.backend_id and started > snapshot.taken_at
        ]  # fmt: skip
        if not newer:
            return snapshot
        pinned = {slot for slot in newer if slot is not None}
        slots = tuple(replace(s, is_processing=True) if s.id in pinned else s for s in snapshot.slots)
        running = snapshot.running + len(newer)
        capacity = snapshot.total_slots
        queued = snapshot.queued + max(0, running - capacity) if capacity else snapshot.queued
        running = min(running, capacity) if capacity else running
        return replace(snapshot, running=running, queued=queued, slots=slots)

    def begin(self, backend_id: str, slot: int | None) -> int:
        """Note a request sent to ``backend_id``; returns the token that :meth:`end` takes."""
        token = next(self._tokens)
        self._open[token] = (backend_id, slot, time.time())
        return token

    def end(self, token: int) -> None:
        self._open.pop(token, None)

    def adapter(self, backend_id: str) -> Adapter:
        return self.adapters[backend_id]

    def _store(self, snapshot: BackendSnapshot) -> None:
        previous = self._snapshots.get(snapshot.backend_id)
        if previous is None or previous.health != snapshot.health:
            log.info(
                "backend.health", backend=snapshot.backend_id, health=snapshot.health, error=snapshot.error
            )
        self._snapshots[snapshot.backend_id] = snapshot
        self._view = tuple(self._snapshots.values())
        stale = snapshot.taken_at - OPEN_REQUEST_HORIZON_S  # a request not ended by now was lost
        for token in [t for t, (_, _, started) in self._open.items() if started < stale]:
            del self._open[token]

    def report_failure(self, backend_id: str, error: str) -> None:
        """A request found the backend unreachable: route around it until the next probe says otherwise."""
        current = self._snapshots[backend_id]
        self._store(replace(current, health=Health.DOWN, taken_at=time.time(), error=error))

    async def probe_all(self) -> tuple[BackendSnapshot, ...]:
        """Probe every backend once, concurrently, and store the results."""
        results = await asyncio.gather(*(adapter.probe() for adapter in self.adapters.values()))
        for snapshot in results:
            self._store(snapshot)
        return self._view

    async def _loop(self, adapter: Adapter) -> None:
        while True:
            await asyncio.sleep(adapter.spec.probe_interval_s)
            self._store(await adapter.probe())

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
