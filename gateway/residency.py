"""Which member of each residency set holds the GPUs, and the switch that moves them (docs/residency.md).

A residency set (``[[residency]]``) is deployments that share GPU memory: one is awake, the others
asleep (vLLM's sleep mode) or unloaded (llama-server's router mode). Routing sends nothing to a member
that is not awake (``RoutingContext.asleep``, the ``awake`` stage). A switch, started by an admin
(``POST /admin/api/residency/{set}``), runs four steps and records each one's seconds:

1. **drain**: the awake member takes no new request; the switch waits for the ones in flight there to
   finish (at most ``drain_s``: then the switch is called off and the member keeps the GPUs; no stream
   is cut);
2. **free**: it gives the GPUs back (``backends.residency``: sleep, or save the slots and unload);
3. **wake**: the new member takes them (wake up, or load and restore its slots);
4. **probe**: the new member is probed until it is ready; then routing sends it requests.

A request whose model only a member being woken serves waits for it, at most ``wait_s``
(``Residency.wait_for``; ``gateway.lifecycle``), and its answer says how long
(``x-turnout-residency-wait``). A failed free or wake puts the old member back (woken again if it
had been freed) and the failure is reported: ``/health``, ``turnout_residency_switches_total``, the
admin API. The switches are this replica's: one gateway drives a set (docs/residency.md).
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import Awaitable, Callable, Mapping, Sequence
from dataclasses import dataclass, field
from enum import StrEnum
from typing import Any

import httpx
import structlog

from backends.clock import Clock
from backends.fleet import Fleet
from backends.residency import EngineSwitch, LlamaRouterModel, SwitchError, VllmSleep
from gateway.settings import Settings
from gateway.settings_residency import ResidencyConfig
from policies import EngineKind
from policies.types import Health

log = structlog.get_logger(__name__)
POLL_S = 0.05
"""How often a drain looks at the requests in flight, and a probe after a wake is repeated."""
HISTORY = 20
"""Switches kept per set for the admin API and the dashboard."""

Sleep = Callable[[float], Awaitable[None]]


class Phase(StrEnum):
    STEADY = "steady"
    DRAINING = "draining"
    FREEING = "freeing"
    WAKING = "waking"
    PROBING = "probing"


class SwitchBusy(Exception):
    """A switch of that set is already running."""


class UnknownMember(Exception):
    """No such set, or no such member of it."""


@dataclass
class Switch:
    """One switch: from which member to which, who asked, each step's seconds, how it ended."""

    set: str
    source: str
    target: str
    by: str
    started_at: float
    steps: dict[str, float] = field(default_factory=dict)
    result: str = "running"  # done, failed, called-off
    error: str | None = None

    def view(self) -> dict[str, Any]:
        return {
            "set": self.set,
            "from": self.source,
            "to": self.target,
            "by": self.by,
            "started_at": self.started_at,
            "steps_s": {k: round(v, 3) for k, v in self.steps.items()},
            "total_s": round(sum(self.steps.values()), 3),
            "result": self.result,
            "error": self.error,
        }


@dataclass
class SetState:
    config: ResidencyConfig
    members: dict[str, EngineSwitch]
    awake: str
    phase: Phase = Phase.STEADY
    current: Switch | None = None
    history: list[Switch] = field(default_factory=list)
    counts: dict[str, int] = field(default_factory=dict)
    """Switches by how they ended (done, failed, called-off)."""
    changed: asyncio.Event = field(default_factory=asyncio.Event)

    def notify(self) -> None:
        self.changed.set()
        self.changed = asyncio.Event()


def engine_switches(settings: Settings, client: httpx.AsyncClient, sleep: Sleep) -> dict[str, EngineSwitch]:
    """How each residency member sleeps and wakes (``backends.residency``), by backend id."""
    backends = {b.id: b for b in settings.backends}
    out: dict[str, EngineSwitch] = {}
    for one in settings.residency:
        for member in one.members:
            backend = backends[member.backend]
            common: dict[str, Any] = {
                "backend_id": backend.id,
                "base_url": backend.base_url,
                "client": client,
                "api_key": backend.api_key,
                "timeout_s": one.step_timeout_s,
                "sleep": sleep,
            }
            if backend.kind is EngineKind.VLLM:
                out[backend.id] = VllmSleep(**common, level=member.sleep_level)
            else:
                model = member.router_model or router_model_of(settings, backend.id)
                out[backend.id] = LlamaRouterModel(**common, model=model, save_slots=member.save_slots)
    return out


def router_model_of(settings: Settings, backend_id: str) -> str:
    """A router-mode llama.cpp member's model: its ``router_model``, else its deployment's name."""
    member = settings.residency_member(backend_id)
    if member is not None and member.router_model:
        return member.router_model
    names = sorted(
        {d.upstream_name for m in settings.models for d in m.deployments if d.backend == backend_id}
    )
    return names[0] if names else backend_id


class Residency:
    """The residency sets of one gateway (module docstring)."""

    def __init__(
        self,
        sets: Sequence[ResidencyConfig],
        switches: Mapping[str, EngineSwitch],
        fleet: Fleet,
        clock: Clock,
        sleep: Sleep = asyncio.sleep,
    ) -> None:
        self.fleet = fleet
        self.clock = clock
        self.sleep = sleep
        self.sets = {
            s.name: SetState(s, {m.backend: switches[m.backend] for m in s.members}, s.first_awake)
            for s in sets
        }
        self._tasks: set[asyncio.Task[None]] = set()

    def asleep(self) -> Mapping[str, str]:
        """Backend -> why it takes no request now (``RoutingContext.asleep``)."""
        out: dict[str, str] = {}
        for name, state in self.sets.items():
            switch = state.current
            for backend in state.members:
                if backend == state.awake and state.phase is Phase.STEADY:
                    continue
                if switch is not None and backend == switch.source and state.phase is Phase.DRAINING:
                    out[backend] = f"draining: residency set {name!r} switches the GPUs to {switch.target}"
                elif switch is not None and backend == switch.target:
                    out[backend] = f"{state.phase.value}: residency set {name!r} switches the GPUs to it"
                elif switch is not None and backend == switch.source:
                    out[backend] = (
                        f"{state.phase.value}: residency set {name!r} switches the GPUs to {switch.target}"
                    )
                else:
                    out[backend] = f"asleep: residency set {name!r} holds {state.awake} awake"
        return out

    def waking(self, backends: Sequence[str]) -> list[str]:
        """Of ``backends``, those a running switch is waking (a request for them can wait)."""
        return [
            b
            for s in self.sets.values()
            if s.current is not None and s.current.result == "running"
            for b in backends
            if b == s.current.target
        ]

    async def wait_for(self, backends: Sequence[str], timeout_s: float | None = None) -> bool:
        """Wait until one of ``backends`` is awake, while a switch is waking it, at most its set's
        ``wait_s`` (or ``timeout_s``); whether one is."""
        sets = [s for s in self.sets.values() if any(b in s.members for b in backends)]
        limit = timeout_s if timeout_s is not None else min((s.config.wait_s for s in sets), default=0.0)
        deadline = time.monotonic() + limit
        while True:
            if any(s.phase is Phase.STEADY and s.awake in backends for s in sets):
                return True
            left = deadline - time.monotonic()
            if left <= 0 or not self.waking(backends):
                return False
            events = [asyncio.ensure_future(s.changed.wait()) for s in sets]
            try:
                await asyncio.wait(events, timeout=left, return_when=asyncio.FIRST_COMPLETED)
            finally:
                for event in events:
                    event.cancel()

    async def reconcile(self) -> None:
        """At start: each set's engines as its config says, the ``awake`` member awake and the others
        asleep (a vLLM starts awake; an idle one that is not the set's is put to sleep, a router-mode
        model loaded or unloaded). An engine that cannot say is left alone and logged."""
        for name, state in self.sets.items():
            for backend, member in state.members.items():
                try:
                    awake = await member.awake()
                    if backend == state.awake and awake is False:
                        log.info("residency.reconcile", set=name, backend=backend, action="wake")
                        await member.wake()
                        await self._ready(backend, state.config.step_timeout_s)
                    elif backend != state.awake and awake is True:
                        log.info("residency.reconcile", set=name, backend=backend, action="free")
                        if await self._drain(backend, state.config.drain_s):
                            await member.free()
                except (SwitchError, TimeoutError) as exc:
                    log.warning("residency.reconcile_failed", set=name, backend=backend, error=str(exc))

    def start(self, name: str, target: str, by: str) -> Switch:
        """Start a switch of set ``name`` to ``target`` in the background; returns its record."""
        state = self.sets.get(name)
        if state is None or target not in state.members:
            known = ", ".join(state.members) if state is not None else ", ".join(self.sets)
            what = f"member {target!r} of {name!r}" if state is not None else f"residency set {name!r}"
            raise UnknownMember(f"no {what} (known: {known or 'none'})")
        if state.current is not None:
            raise SwitchBusy(
                f"{name}: a switch from {state.current.source} to {state.current.target} is running"
            )
        switch = Switch(name, state.awake, target, by, self.clock.time())
        state.current = switch
        if target == state.awake:
            switch.result = "done"
            self._finish(state, switch)
            return switch
        task = asyncio.create_task(self.run(state, switch), name=f"residency-{name}")
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)
        return switch

    async def run(self, state: SetState, switch: Switch) -> None:
        """The switch's steps (module docstring); never raises."""
        source, target = state.members[switch.source], state.members[switch.target]
        log.info("residency.switch", set=switch.set, source=switch.source, target=switch.target, by=switch.by)
        freed = False
        try:
            self._phase(state, Phase.DRAINING)
            if not await self._timed(switch, "drain", self._drain(switch.source, state.config.drain_s)):
                switch.result = "called-off"
                switch.error = (
                    f"{switch.source} still had requests in flight after {state.config.drain_s:g} s:"
                    " it keeps the GPUs"
                )
                return
            self._phase(state, Phase.FREEING)
            await self._timed(switch, "free", source.free())
            freed = True
            if not source.restores():  # what it held is gone: routing must not count on it
                self.fleet.forget(switch.source, f"residency {switch.set}: gave the GPUs to {switch.target}")
            self._phase(state, Phase.WAKING)
            if target.restores():
                self.fleet.resume(switch.target)
            await self._timed(switch, "wake", target.wake())
            self._phase(state, Phase.PROBING)
            await self._timed(switch, "probe", self._ready(switch.target, state.config.step_timeout_s))
            state.awake = switch.target
            switch.result = "done"
        except (SwitchError, TimeoutError) as exc:
            switch.result, switch.error = "failed", str(exc) or type(exc).__name__
            log.error("residency.failed", set=switch.set, error=switch.error)
            await self._restore(state, switch, freed)
        finally:
            self._finish(state, switch)

    async def _restore(self, state: SetState, switch: Switch, freed: bool) -> None:
        """After a failure, the old member holds the GPUs again: woken again if it was freed (the
        target freed too, in case it half-woke)."""
        if not freed:
            return
        try:
            await state.members[switch.target].free()
        except SwitchError as exc:
            log.warning("residency.target_not_freed", set=switch.set, error=str(exc))
        try:
            await state.members[switch.source].wake()
            await self._ready(switch.source, state.config.step_timeout_s)
        except (SwitchError, TimeoutError) as exc:
            switch.error = f"{switch.error}; and {switch.source} did not wake again: {exc}"
            log.error("residency.restore_failed", set=switch.set, error=str(exc))

    def _finish(self, state: SetState, switch: Switch) -> None:
        state.current = None
        state.phase = Phase.STEADY
        state.history = [*state.history, switch][-HISTORY:]
        state.counts[switch.result] = state.counts.get(switch.result, 0) + 1
        log.info("residency.switched", **switch.view())
        state.notify()

    def _phase(self, state: SetState, phase: Phase) -> None:
        state.phase = phase
        state.notify()

    async def _timed(self, switch: Switch, step: str, work: Awaitable[Any]) -> Any:
        started = time.monotonic()
        try:
            return await work
        finally:
            switch.steps[step] = time.monotonic() - started

    async def _drain(self, backend: str, limit_s: float) -> bool:
        deadline = time.monotonic() + limit_s
        while self.fleet.own(backend).requests:
            if time.monotonic() > deadline:
                return False
            await self.sleep(POLL_S)
        return True

    async def _ready(self, backend: str, limit_s: float) -> None:
        deadline = time.monotonic() + limit_s
        adapter = self.fleet.adapter(backend)
        while True:
            snapshot = await adapter.probe()
            self.fleet.observe(snapshot)
            if snapshot.health is Health.READY:
                return
            if time.monotonic() > deadline:
                raise SwitchError(backend, "probe", f"not ready after {limit_s:g} s: {snapshot.error}")
            await self.sleep(POLL_S)

    def view(self) -> list[dict[str, Any]]:
        """Each set: its members, which is awake, the switch running and the last ones."""
        return [
            {
                "name": name,
                "members": list(state.members),
                "awake": state.awake,
                "phase": state.phase.value,
                "switch": state.current.view() if state.current is not None else None,
                "history": [s.view() for s in reversed(state.history)],
                "counts": dict(state.counts),
                "wait_s": state.config.wait_s,
            }
            for name, state in self.sets.items()
        ]

    def warnings(self) -> list[str]:
        """The last switch of each set, where it failed or was called off (``/health``)."""
        return [
            f"residency {name}: switch to {last.target} {last.result}: {last.error}"
            for name, state in self.sets.items()
            if state.history and (last := state.history[-1]).result != "done"
        ]

    async def stop(self) -> None:
        for task in list(self._tasks):
            task.cancel()
        for task in list(self._tasks):
            with contextlib.suppress(asyncio.CancelledError):
                await task
