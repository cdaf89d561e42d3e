"""One request inside a simulated engine, and the updates the engine sends back to its HTTP handler."""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from dataclasses import dataclass, field
from enum import StrEnum
from typing import Any

from backends.sim.generation import Answer, OutToken


class UpdateKind(StrEnum):
    """What an engine tells the handler waiting on a task."""

    BEGIN = "begin"  # a slot / the batch took the task (llama.cpp flushes headers here)
    TOKEN = "token"
    DONE = "done"
    ERROR = "error"


@dataclass(frozen=True, slots=True)
class SimError:
    """An engine error already in the engine's wire format: HTTP ``status`` and JSON ``body``."""

    status: int
    body: dict[str, Any]


@dataclass(frozen=True, slots=True)
class Update:
    """One message from engine to handler."""

    kind: UpdateKind
    token: OutToken | None = None
    error: SimError | None = None


@dataclass(eq=False)
class SimTask:
    """A request's prompt, the answer it will get, and its progress (mutated only by the engine).

    Times are *simulated* seconds on the engine's clock (the sum of simulated step durations), so
    reported timings do not depend on ``time_scale``.

    Updates go to ``outbox`` (an asyncio queue the HTTP handler reads), or, when ``listener`` is
    given, to ``listener`` at once, from inside the engine's step (the virtual-time replay); such a
    task has no ``outbox``. A listener may submit or cancel tasks.
    """

    id: str
    prompt: list[int]
    answer: Answer
    number: int = 0
    id_slot: int = -1
    cache_prompt: bool = True
    user_start: int = -1  # where the last user message starts (``GenRequest.user_start``)
    first_user: int = -1  # where the first user message starts (``GenRequest.first_user``)
    listener: Callable[[Update], None] | None = None
    outbox: asyncio.Queue[Update] = field(init=False, repr=False)
    cached: int = 0
    prefill_left: int = 0
    n_emitted: int = 0
    slot: int | None = None
    sim_start: float = 0.0
    sim_prompt_end: float = 0.0
    sim_last: float = 0.0
    started: bool = False
    finished: bool = False

    def __post_init__(self) -> None:
        if self.listener is None:
            self.outbox = asyncio.Queue()

    @property
    def prompt_tokens(self) -> int:
        """Full prompt length, cached tokens included."""
        return len(self.prompt)

    @property
    def generated(self) -> tuple[OutToken, ...]:
        """Tokens produced so far."""
        return self.answer.tokens[: self.n_emitted]

    def send(self, update: Update) -> None:
        """Give an update to the listener, or queue it for the handler."""
        if self.listener is not None:
            self.listener(update)
        else:
            self.outbox.put_nowait(update)
