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
        self._open: dict[int, tuple[str, int | None, float, float]] = {}
        self._tokens = itertools.count()
        self._ended: dict[
            tuple[str, int], float
        ] = {}  # (backend, slot) -> when turnout's last request there ended

    def snapshots(self) -> tuple[BackendSnapshot, ...]:
        """The latest snapshots, plus the requests turnout itself sent since each was taken.

        A probe is up to ``probe_interval_s`` old; a burst routed on it alone would all pick the
        backend that looked idle. Requests begun after a snapshot count as running there (and their
        llama.cpp slots as busy) until the next probe sees them itself. A slot running a request of
        turnout's also says how long that request is still predicted to take (``busy_s``).
        """
        if not self._open and not self._ended:
            return self._view
        now = time.time()
        return tuple(self._with_open_requests(snapshot, now) for snapshot in self._view)

    def _with_open_requests(self, snapshot: BackendSnapshot, now: float) -> BackendSnapshot:
        mine = [
            (slot, started, expected)
            for backend, slot, started, expected in self._open.values()
            if backend == snapshot.backend_id
        ]
        ended = {
            slot
            for (backend, slot), at in self._ended.items()
            if backend == snapshot.backend_id and at > snapshot.taken_at
        }
        if not mine and not ended:
            return snapshot
        newer = [slot for slot, started, _ in mine if started > snapshot.taken_at]
        busy: dict[int, float] = {}
        for slot, started, expected in mine:
            if slot is not None:
                busy[slot] = max(busy.get(slot, 0.0), expected - (now - started), 0.0)
        pinned = {slot for slot in newer if slot is not None}
        freed = ended - set(busy)  # the probe saw turnout's request there, which has ended since
        slots = tuple(
            replace(
                s,
                is_processing=(s.is_processing and s.id not in freed) or s.id in pinned,
                busy_s=busy.get(s.id),
            )
            for s in snapshot.slots
        )
        if not newer:
            return replace(snapshot, slots=slots)
        running = snapshot.running + len(newer)
        capacity = snapshot.total_slots
        queued = snapshot.queued + max(0, running - capacity) if capacity else snapshot.queued
        running = min(running, capacity) if capacity else running
        return replace(snapshot, running=running, queued=queued, slots=slots)

    def begin(self, backend_id: str, slot: int | None, expected_s: float = 0.0) -> int:
        """Note a request sent to ``backend_id``, predicted to take ``expected_s``."""
        token = next(self._tokens)
        self._open[token] = (backend_id, slot, time.time(), expected_s)
        return token

    def end(self, token: int) -> None:
        request = self._open.pop(token, None)
        if request is not None and request[1] is not None:
            self._ended[(request[0], request[1])] = time.time()

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
        for key in [
            k for k, at in self._ended.items() if k[0] == snapshot.backend_id and at < snapshot.taken_at
        ]:
            del self._ended[key]  # the probe has seen the slot since
        stale = snapshot.taken_at - OPEN_REQUEST_HORIZON_S  # a request not ended by now was lost
        for token in [t for t, (_, _, started, _) in self._open.items() if started < stale]:
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
