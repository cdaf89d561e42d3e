"""The simulator's event log: what tests (and ``GET /_sim/events``) read to see scheduling decisions."""

from __future__ import annotations

from dataclasses import asdict, dataclass
from enum import StrEnum
from typing import Any

from backends.clock import WALL, Clock


class EventKind(StrEnum):
    """Lifecycle points of one request inside a simulated engine."""

    START = "start"  # a slot / the batch took the request; prompt processing begins
    FINISH = "finish"  # the last token was produced
    CANCEL = "cancel"  # the client went away while queued or running
    REJECT = "reject"  # refused with an error (e.g. prompt longer than the context)


@dataclass(frozen=True, slots=True)
class SimEvent:
    """One lifecycle event. ``at`` is the engine clock's ``monotonic()``; ``slot`` is None for vLLM."""

    kind: EventKind
    request_id: str
    at: float
    prompt_tokens: int
    cached_tokens: int
    completion_tokens: int
    slot: int | None

    def to_json(self) -> dict[str, Any]:
        """A JSON-ready dict of the fields."""
        return asdict(self)


class EventLog:
    """An append-only list of :class:`SimEvent` stamped by ``clock`` (``events`` is the live list)."""

    def __init__(self, clock: Clock = WALL) -> None:
        self.clock = clock
        self.events: list[SimEvent] = []

    def record(
        self,
        kind: EventKind,
        request_id: str,
        *,
        prompt_tokens: int,
        cached_tokens: int = 0,
        completion_tokens: int = 0,
        slot: int | None = None,
    ) -> SimEvent:
        """Append and return an event stamped now."""
        event = SimEvent(
            kind, request_id, self.clock.monotonic(), prompt_tokens, cached_tokens, completion_tokens, slot
        )
        self.events.append(event)
        return event
