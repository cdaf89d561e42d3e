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
from collections.abc import Awaitable, Mapping, Sequence
from typing import Any

import httpx
import structlog

from backends.clock import Clock
from backends.fleet import Fleet
from backends.residency import EngineSwitch, LlamaRouterModel, SwitchError, VllmSleep
from gateway.residency_state import (
    HISTORY,
    ON_DEMAND,
    START,
    Phase,
    SetState,
    Sleep,
    Switch,
    SwitchBusy,
    UnknownMember,
)
from gateway.settings import Settings
from gateway.settings_residency import ResidencyConfig
from policies import EngineKind
from policies.types import Health

__all__ = ["Phase", "Residency", "SwitchBusy", "UnknownMember", "engine_switches", "router_model_of"]

log = structlog.get_logger(__name__)
POLL_S = 0.05
ON_DEMAND_RETRY_S = 30.0
"""After a switch to a member fails or is called off, demand does not ask for that member again
for this long (each try drains, frees and wakes the member that works)."""
"""How often a drain looks at the requests in flight, and a probe after a wake is repeated."""


def engine_switches(
    settings: Settings, client: httpx.AsyncClient, sleep: Sleep, clock: Clock
) -> dict[str, EngineSwitch]:
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
                "clock": clock,
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
        return {
            backend: why
            for name, state in self.sets.items()
            for backend in state.members
            if (why := state.why_asleep(name, backend)) is not None
        }

    def waking(self, backends: Sequence[str]) -> list[str]:
        """Of ``backends``, those a running switch (or the start-up check) is waking: a request for
        them can wait."""
        return [
            b
            for s in self.sets.values()
            if s.current is not None and s.current.result == "running"
            for b in backends
            if b == s.current.target
        ]

    def can_wake(self, backends: Sequence[str], serving: Sequence[str] = ()) -> bool:
        """Whether a request that only ``backends`` (asleep) could take may wait: a switch is waking
        one of them, or a set would wake one on demand (``serving``: every backend that serves the
        request's model, whatever kept it from taking it)."""
        return bool(self.waking(backends)) or any(
            self._wants(s, backends, serving) is not None for s in self.sets.values()
        )

    def _wants(self, state: SetState, backends: Sequence[str], serving: Sequence[str]) -> str | None:
        """The member of ``state`` demand would wake for such a request. None where the set does not
        wake on demand, where its awake member (or the one a running switch wakes) serves the model
        too but cannot take it (down, drained or excluded after a failure: waking another would move
        the model there for good), or where a switch to the member failed less than
        ``ON_DEMAND_RETRY_S`` ago."""
        holder = state.current.target if state.current is not None else state.awake  # once it ends
        if not state.config.on_demand or (holder in serving and holder not in backends):
            return None
        now = self.clock.monotonic()
        return next(
            (
                b
                for b in backends
                if b in state.members
                and b != holder
                and now - state.refused.get(b, float("-inf")) >= ON_DEMAND_RETRY_S
            ),
            None,
        )

    def on_demand(self, backends: Sequence[str], serving: Sequence[str] = ()) -> None:
        """Start a switch (``by`` "on-demand") in the first set that would wake one of ``backends``
        for such a request, if it is steady and its member awake has held the GPUs ``min_awake_s``."""
        now = self.clock.monotonic()
        for name, state in self.sets.items():
            wanted = self._wants(state, backends, serving)
            if wanted is None:
                continue
            steady = state.current is None and state.phase is Phase.STEADY
            if steady and now >= state.woke_at + state.config.min_awake_s:
                log.info("residency.on_demand", set=name, wake=wanted, awake=state.awake)
                self.start(name, wanted, ON_DEMAND)
            return  # one set a request

    def _turn_coming(self, backends: Sequence[str], serving: Sequence[str]) -> float | None:
        """Seconds until a set that would wake one of ``backends`` on demand may start its switch (0:
        when the switch running there ends); None: no set will."""
        now = self.clock.monotonic()
        for state in self.sets.values():
            if self._wants(state, backends, serving) is not None:
                return (
                    0.0
                    if state.current is not None
                    else max(0.0, state.woke_at + state.config.min_awake_s - now)
                )
        return None

    async def wait_for(
        self, backends: Sequence[str], timeout_s: float | None = None, serving: Sequence[str] = ()
    ) -> bool:
        """Wait until one of ``backends`` is awake, while a switch is waking it (in a set that wakes on
        demand: after starting that switch, or once the switch running there or the awake member's
        ``min_awake_s`` ends), at most its set's ``wait_s`` (or ``timeout_s``); whether one is. A
        switch to one of them that fails or is called off meanwhile ends the wait at once."""
        sets = [s for s in self.sets.values() if any(b in s.members for b in backends)]
        limit = timeout_s if timeout_s is not None else min((s.config.wait_s for s in sets), default=0.0)
        began = self.clock.monotonic()
        deadline = began + limit
        while True:
            if any(s.phase is Phase.STEADY and s.awake in backends for s in sets):
                return True
            if any(s.refused.get(b, float("-inf")) >= began for s in sets for b in backends):
                return False
            self.on_demand(backends, serving)
            left = deadline - self.clock.monotonic()
            coming = None if self.waking(backends) else self._turn_coming(backends, serving)
            if left <= 0 or (not self.waking(backends) and coming is None):
                return False
            events = [asyncio.ensure_future(s.changed.wait()) for s in sets]
            try:
                await asyncio.wait(
                    events, timeout=min(left, coming or left), return_when=asyncio.FIRST_COMPLETED
                )
            finally:
                for event in events:
                    event.cancel()

    def start(self, name: str, target: str, by: str) -> Switch:
        """Start a switch of set ``name`` to ``target`` in the background; returns its record (one to
        the member awake already changes nothing: ``unchanged``, not recorded)."""
        state = self.sets.get(name)
        if state is None or target not in state.members:
            known = ", ".join(state.members) if state is not None else ", ".join(self.sets)
            what = f"member {target!r} of {name!r}" if state is not None else f"residency set {name!r}"
            raise UnknownMember(f"no {what} (known: {known or 'none'})")
        if state.current is not None:
            running = state.current
            raise SwitchBusy(f"{name}: a switch from {running.source} to {running.target} is running")
        switch = Switch(name, state.awake, target, by, self.clock.time())
        if target == state.awake:
            switch.result = "unchanged"
            return switch
        state.current = switch
        self.spawn(self.run(state, switch), f"residency-{name}")
        return switch

    def spawn(self, work: Awaitable[None], name: str) -> None:
        """Run ``work`` in the background until it ends or ``stop``."""
        task = asyncio.ensure_future(work)
        task.set_name(name)
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    async def run(self, state: SetState, switch: Switch) -> None:
        """The switch's steps (module docstring); never raises: any failure ends it ``failed`` and
        puts the old member back."""
        source, target = state.members[switch.source], state.members[switch.target]
        log.info("residency.switch", set=switch.set, source=switch.source, target=switch.target, by=switch.by)
        freeing = False
        try:
            self.phase(state, Phase.DRAINING)
            drain_s = state.config.drain_s  # on demand: no longer than the request that asked waits
            drain_s = min(drain_s, state.config.wait_s) if switch.by == ON_DEMAND else drain_s
            if not await self.timed(switch, "drain", self.drain(switch.source, drain_s)):
                switch.result = "called-off"
                switch.error = (
                    f"{switch.source} still had requests in flight after {drain_s:g} s: it keeps the GPUs"
                )
                return
            self.phase(state, Phase.FREEING)
            freeing = True
            await self.timed(switch, "free", source.free())
            self.emptied(switch.source, source, f"residency {switch.set}: gave the GPUs to {switch.target}")
            self.phase(state, Phase.WAKING)
            await self.timed(switch, "wake", target.wake())
            self.resumed(switch.target, target)
            self.phase(state, Phase.PROBING)
            await self.timed(switch, "probe", self.ready(switch.target, state.config.step_timeout_s))
            state.awake = switch.target
            switch.result = "done"
        except Exception as exc:  # any failure, an odd answer included: undo, never leave it half done
            switch.result, switch.error = "failed", str(exc) or type(exc).__name__
            log.error(
                "residency.failed",
                set=switch.set,
                error=switch.error,
                exc_info=not isinstance(exc, SwitchError),
            )
            if freeing:
                await self.restore(state, switch)
        finally:
            self.finish(state, switch)

    def emptied(self, backend: str, member: EngineSwitch, why: str) -> None:
        """A member gave the GPUs back: unless it keeps what it held for its next wake (a llama-server
        model's saved slots), routing forgets it (a vLLM sleep empties its prefix cache)."""
        if not member.keeps():
            self.fleet.forget(backend, why)

    def resumed(self, backend: str, member: EngineSwitch) -> None:
        """A member woke: holding all it held (its slots restored), or nothing of it."""
        if member.restores():
            self.fleet.resume(backend)
        elif member.keeps():
            self.fleet.forget(backend, "its saved slots did not all come back")

    async def restore(self, state: SetState, switch: Switch) -> None:
        """After a failure from the free on, the old member holds the GPUs again: the target freed (in
        case it half-woke), the source woken and probed unless it says it never slept. Never raises."""
        source = state.members[switch.source]
        try:
            if await source.awake() is True:  # the free failed before it took: nothing to undo
                return
        except Exception as exc:
            log.warning("residency.source_unknown", set=switch.set, error=str(exc))
        with contextlib.suppress(Exception):
            if await state.members[switch.target].awake() is not False:
                await state.members[switch.target].free()
        try:
            await source.wake()
            self.resumed(switch.source, source)
            await self.ready(switch.source, state.config.step_timeout_s)
        except Exception as exc:
            switch.error = f"{switch.error}; and {switch.source} did not wake again: {exc}"
            log.error("residency.restore_failed", set=switch.set, error=str(exc))

    def finish(self, state: SetState, switch: Switch) -> None:
        state.current = None
        state.phase = Phase.STEADY
        if switch.result == "done":
            state.woke_at = self.clock.monotonic()
        elif switch.result in ("failed", "called-off"):
            state.refused[switch.target] = self.clock.monotonic()
        state.history = [*state.history, switch][-HISTORY:]
        if switch.by != START:  # the start-up check is on /health and the page, not a switch
            state.counts[switch.result] = state.counts.get(switch.result, 0) + 1
        log.info("residency.switched", **switch.view())
        state.notify()

    def phase(self, state: SetState, phase: Phase) -> None:
        state.phase = phase
        state.notify()

    async def timed(self, switch: Switch, step: str, work: Awaitable[Any]) -> Any:
        started = self.clock.monotonic()
        try:
            return await work
        finally:
            switch.steps[step] = self.clock.monotonic() - started

    async def drain(self, backend: str, limit_s: float) -> bool:
        """Until this gateway has no request in flight on ``backend`` (False: still some after
        ``limit_s``)."""
        deadline = self.clock.monotonic() + limit_s
        while self.fleet.own(backend).requests:
            if self.clock.monotonic() > deadline:
                return False
            await self.sleep(POLL_S)
        return True

    async def ready(self, backend: str, limit_s: float) -> None:
        """Probe ``backend`` until it is ready (SwitchError after ``limit_s``)."""
        deadline = self.clock.monotonic() + limit_s
        adapter = self.fleet.adapter(backend)
        while True:
            snapshot = await adapter.probe()
            self.fleet.observe(snapshot)
            if snapshot.health is Health.READY:
                return
            if self.clock.monotonic() > deadline:
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
                "on_demand": state.config.on_demand,
            }
            for name, state in self.sets.items()
        ]

    async def stop(self) -> None:
        for task in list(self._tasks):
            task.cancel()
        for task in list(self._tasks):
            with contextlib.suppress(asyncio.CancelledError):
                await task
