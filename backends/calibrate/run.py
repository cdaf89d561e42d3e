"""One ``turnout calibrate`` run's options and state (``backends.calibrate.procedure`` runs the steps):
the budget, the points measured, the notes, and for llama.cpp the slots used, what each holds
(``SlotBook``) and the costs of its saves and restores as measured."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from dataclasses import replace as with_fields

from backends.calibrate.engines import Engine, Prefill
from backends.calibrate.saves import SaveCost, SlotBook
from policies.engine_profile import Point, PrefillModel

Progress = Callable[[str], None]
Clock = Callable[[], float]


@dataclass(frozen=True)
class Options:
    name: str
    budget_s: float = 600.0
    ubatch: int | None = None
    """Micro-batch tokens (llama.cpp ``--ubatch-size``; default 512); vLLM: ``batch``."""
    batch: int | None = None
    """Tokens per engine step (llama.cpp ``--batch-size``, vLLM ``--max-num-batched-tokens``); 2048."""
    checkpoint_splits: bool = True
    """llama.cpp serving a hybrid (or SWA) model with context checkpoints."""
    window: int | None = None
    """Measure prompts up to this many tokens (default: the engine's window)."""
    machine: tuple[tuple[str, str], ...] = ()
    source: str = ""
    seed: int = 0
    repeat: int = 2
    """Measure each cold prefill and decode point this many times and keep the fastest (only where
    that costs little of the budget): noise on a shared machine only adds time."""


@dataclass
class Run:
    engine: Engine
    options: Options
    clock: Clock
    progress: Progress
    started: float
    shape: PrefillModel
    prefill: list[Point] = field(default_factory=list)
    decode: list[Point] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)
    used_slots: set[int] = field(default_factory=set)
    book: SlotBook = field(default_factory=SlotBook)
    """llama.cpp: what each slot holds, for the RAM-cache saves each request waits for (``saves``)."""
    saves: SaveCost = field(default_factory=SaveCost)
    point_tries: list[tuple[Prefill, ...]] = field(default_factory=list)
    """Each prefill point's tries, with the saves each waited for: once a save's cost is measured,
    the point is the fastest try without its saves (the fastest as timed may have waited for none
    only because it came first)."""
    restore_s: float = 0.0
    """llama.cpp, hybrid: a context checkpoint's restore (``restore``)."""
    checkpoint_s: float = 0.0
    """llama.cpp, hybrid: a context checkpoint taken as a prompt is processed (``restore``)."""

    def left(self) -> float:
        return self.options.budget_s - (self.clock() - self.started)

    def repeat(self, guess_s: float) -> int:
        """How often to measure a point estimated at ``guess_s``: ``Options.repeat`` times (the
        fastest counts: a busy machine only ever adds time) while that stays a small part of the
        budget, else once."""
        if self.options.repeat > 1 and guess_s * self.options.repeat <= self.left() * 0.1:
            return self.options.repeat
        return 1

    def rate_s(self, tokens: int) -> float:
        """A pessimistic guess of a cold prefill of ``tokens`` from what was measured (0: no idea)."""
        if not self.prefill:
            return 0.0
        sized = [p for p in self.prefill if p.a >= 256] or self.prefill
        per_token = max(p.seconds / max(p.a, 1) for p in sized)
        return 1.2 * per_token * tokens + self.prefill[0].seconds

    def say(self, step: int, steps: int, what: str) -> None:
        filled = round(20 * step / max(steps, 1))
        elapsed = self.clock() - self.started
        self.progress(
            f"[{'#' * filled}{'-' * (20 - filled)}] {step}/{steps} {what}"
            f"  ({elapsed:.0f} s of {self.options.budget_s:.0f} s)"
        )

    async def prefill_on(self, tokens: Sequence[int], slot: int = 0) -> Prefill:
        self.used_slots.add(slot)
        saved = self.book.launch(tokens, slot) if self.engine.info.engine == "llamacpp" else ()
        return with_fields(await self.engine.prefill(tokens, slot), saved=saved)

    def saved_s(self, got: Prefill) -> float:
        """What the RAM-cache saves ``got`` waited for cost (as measured: ``saves``)."""
        return sum(self.saves.seconds(saved) for saved in got.saved)

    def add_point(self, *tries: Prefill) -> None:
        """One prefill point measured ``tries`` times: the fastest counts."""
        got = min(tries, key=lambda t: t.seconds)
        self.prefill.append(Point(got.processed, got.cached, round(got.seconds, 6)))
        self.point_tries.append(tries)

    def without_saves(self) -> None:
        """Each prefill point again: its fastest try without the saves it waited for (``saves``)."""
        fastest = [
            min(tries, key=lambda t: self.saves.without(t.seconds, t.saved)) for tries in self.point_tries
        ]
        self.prefill = [
            Point(t.processed, t.cached, round(self.saves.without(t.seconds, t.saved), 6)) for t in fastest
        ]
