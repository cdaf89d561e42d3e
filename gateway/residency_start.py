"""At start, each residency set's engines made to match its config (``Residency`` keeps the state;
docs/residency.md, "Configure a set").

A set's start-up check runs as a switch of its own (``by: start``): while it runs, an admin's switch is
refused (409) and routing sends none of its members a request; a request for one waits for it like any
switch, at most ``wait_s``. It frees first and wakes last, so two members never hold the cards at
once: every member but ``awake`` that says it is awake is put to sleep (or its model unloaded), then
``awake`` is woken if it sleeps, and probed until it is ready. An engine that cannot say yet (it is
still starting: compose starts turnout beside its engines) is asked again every ``RETRY_S`` after the
check, for up to the set's ``step_timeout_s``, and put to sleep if it turns out awake while no other
switch runs.
"""

from __future__ import annotations

import structlog

from backends.residency import EngineSwitch
from gateway.residency import Residency
from gateway.residency_state import START, Phase, SetState, Switch

log = structlog.get_logger(__name__)
RETRY_S = 5.0
"""How often an engine that could not say whether it is awake is asked again after the check."""


def check_at_start(residency: Residency) -> None:
    """Start every set's check in the background (cancelled by ``Residency.stop``)."""
    for name, state in residency.sets.items():
        state.current = Switch(name, "?", state.awake, START, residency.clock.time())
        state.phase = Phase.STARTING
        residency.spawn(_check(residency, name, state), f"residency-start-{name}")


async def _asks(member: EngineSwitch) -> bool | None:
    """Whether the member is awake; None when it cannot say (down, starting, no sleep endpoints)."""
    try:
        return await member.awake()
    except Exception as exc:  # an engine still starting answers nothing yet
        log.info("residency.start_unknown", backend=getattr(member, "backend_id", "?"), error=str(exc))
        return None


async def _check(residency: Residency, name: str, state: SetState) -> None:
    switch = state.current
    assert switch is not None
    unknown: list[str] = []
    try:
        for backend, member in state.members.items():  # free first: never two on the cards at once
            if backend == state.awake:
                continue
            awake = await _asks(member)
            if awake is None:
                unknown.append(backend)
            elif awake:
                log.info("residency.start", set=name, backend=backend, action="free")
                await residency.timed(switch, f"free {backend}", member.free())
                residency.emptied(backend, member, "put to sleep at start")
        target = state.members[state.awake]
        if await _asks(target) is False:
            log.info("residency.start", set=name, backend=state.awake, action="wake")
            await residency.timed(switch, "wake", target.wake())
        await residency.timed(switch, "probe", residency.ready(state.awake, state.config.step_timeout_s))
        switch.result = "done"
    except Exception as exc:  # the set stays as configured; the failure is on /health and the page
        switch.result, switch.error = "failed", str(exc) or type(exc).__name__
        log.error("residency.start_failed", set=name, error=switch.error)
    finally:
        residency.finish(state, switch)
    await _later(residency, name, state, unknown)


async def _later(residency: Residency, name: str, state: SetState, unknown: list[str]) -> None:
    """Ask the members that could not say again, and put to sleep any that turns out awake."""
    deadline = residency.clock.monotonic() + state.config.step_timeout_s
    while unknown and residency.clock.monotonic() < deadline:
        await residency.sleep(RETRY_S)
        for backend in list(unknown):
            if backend == state.awake:  # an admin switched the cards to it meanwhile
                unknown.remove(backend)
                continue
            awake = await _asks(state.members[backend])
            if backend == state.awake:  # a switch woke it while we asked: it is the one awake now
                unknown.remove(backend)
                continue
            if awake is None or state.current is not None:
                continue  # still silent, or a switch runs: ask again later
            unknown.remove(backend)
            if awake:
                await _free_late(residency, name, state, backend)


async def _free_late(residency: Residency, name: str, state: SetState, backend: str) -> None:
    switch = Switch(name, backend, state.awake, START, residency.clock.time())
    state.current = switch
    residency.phase(state, Phase.FREEING)
    try:
        await residency.timed(switch, "free", state.members[backend].free())
        residency.emptied(backend, state.members[backend], "put to sleep after start")
        switch.result = "done"
    except Exception as exc:
        switch.result, switch.error = "failed", str(exc) or type(exc).__name__
    finally:
        residency.finish(state, switch)
