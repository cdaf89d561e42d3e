"""A residency set's state as the gateway keeps it (``gateway.residency``): which member holds the
GPUs, the phase of the switch running, its record, and the last switches."""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from enum import StrEnum
from typing import Any

from backends.residency import EngineSwitch
from gateway.settings_residency import ResidencyConfig

HISTORY = 20
"""Switches kept per set for the admin API and the dashboard."""
START = "start"
"""Who a switch of the gateway's own start-up is by (``gateway.residency_start``)."""
ON_DEMAND = "on-demand"
"""Who a switch is by when a request woke the member it needs (``ResidencyConfig.on_demand``)."""

Sleep = Callable[[float], Awaitable[None]]


class Phase(StrEnum):
    STEADY = "steady"
    STARTING = "starting"  # the gateway checks its engines against the config (``residency_start``)
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
    result: str = "running"  # done, failed, called-off (unchanged: asked for the member awake)
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
    woke_at: float = float("-inf")
    """When (monotonic) the member awake took the GPUs: on demand, it keeps them ``min_awake_s``."""
    refused: dict[str, float] = field(default_factory=dict)
    """Member -> when (monotonic) a switch to it last failed or was called off."""

    def notify(self) -> None:
        """Wake whoever waits for this set to change (``Residency.wait_for``), once."""
        self.changed.set()
        self.changed = asyncio.Event()

    def why_asleep(self, name: str, backend: str) -> str | None:
        """Why ``backend`` takes no request now (None: it does)."""
        switch = self.current
        if switch is None or self.phase is Phase.STEADY:
            return (
                None if backend == self.awake else f"asleep: residency set {name!r} holds {self.awake} awake"
            )
        if self.phase is Phase.STARTING:
            return f"starting: residency set {name!r} checks its engines"
        if switch.by == START:  # a member found awake after the start-up check is put to sleep
            return (
                None if backend == self.awake else f"asleep: residency set {name!r} holds {self.awake} awake"
            )
        if backend == switch.target:
            return f"{self.phase.value}: residency set {name!r} switches the GPUs to it"
        if backend == switch.source:
            return f"{self.phase.value}: residency set {name!r} switches the GPUs to {switch.target}"
        return f"asleep: residency set {name!r} holds {self.awake} awake"
