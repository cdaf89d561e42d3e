"""Which sessions are live, and where they are at home: counted per gateway process.

Routing weighs a new slot pin by the chance it lasts (``policies.slots.keep_chance``), which needs
how many sessions compete for the slots. A session counts from its turn until ``window`` seconds of
silence; the count is this process's (replicas on one Redis each count what they route).

A llama-server with more active sessions than slots is crowded (``policies.homes``): ``Homes`` counts,
per backend, the sessions with a turn in flight there or one that ended there less than ``ACTIVE_S``
ago, incrementally (routing reads the counts on every decision). It also tells what each of them
will send next (``Homes.coming``: when its turn ends, its think time, its growth a turn), the prompts
an answer decoding there is expected to wait for (``policies.coming``).
"""

from __future__ import annotations

import itertools
from collections import deque

from policies.coming import NextTurn

MAX_TRACKED = 100_000
"""A bound on the bookkeeping (a dict entry per session): beyond it the longest silent go first."""
ACTIVE_S = 10.0
"""How long after its turn ends a session still counts as at home on that turn's backend: an agent's
next turn follows its tool calls within seconds, and one silent for longer competes for no slot now.
(Issue #45, contention-32-8llama over 32 draws: counting a session for 5, 10, 15 or 60 s after its
turn gave a mean TTFT of 7.85, 7.83, 7.85, 7.78 s, p90 15.59, 15.55, 15.60, 15.61 s; 60 s made
contention-8's llama-server look crowded by agents gone quiet, 2.538 -> 2.617 s; docs/benchmarks.md.)"""


class LiveSessions:
    """Sessions by last turn, oldest first: touching one moves it to the end, counting drops the
    expired ones from the front (amortised O(1) per request)."""

    def __init__(self, window: float, max_tracked: int = MAX_TRACKED) -> None:
        self.window = window
        self.max_tracked = max_tracked
        self._seen: dict[str, float] = {}

    def touch(self, key: str, now: float) -> None:
        self._seen.pop(key, None)
        self._seen[key] = now
        if len(self._seen) > self.max_tracked:
            del self._seen[next(iter(self._seen))]

    def count(self, now: float) -> int:
        """Sessions live at ``now``."""
        horizon = now - self.window
        while self._seen:
            oldest = next(iter(self._seen))
            if self._seen[oldest] >= horizon:
                break
            del self._seen[oldest]
        return len(self._seen)


class _Home:
    """Where a session is at home, when its latest turn was placed and its number, how many of its
    turns run, and what its next turn is expected to be: when the one in flight ends (predicted) or
    ended, its think time and its growth a turn (moving averages; None before a sample)."""

    __slots__ = ("at", "backend", "ended_at", "ends_at", "growth", "prompt", "running", "think", "turn")

    def __init__(self, backend: str, at: float, turn: int, running: int) -> None:
        self.backend, self.at, self.turn, self.running = backend, at, turn, running
        self.prompt = 0
        self.ends_at = at
        self.ended_at: float | None = None
        self.growth: float | None = None
        self.think: float | None = None


TURN_WEIGHT = 0.3
"""How much a session's newest think time or growth moves its moving average."""
FLEET_WEIGHT = 0.05
"""How much any session's sample moves the fleet's, which stands for a session's own until it has one."""


def _mean(average: float | None, sample: float, weight: float) -> float:
    return sample if average is None else average + weight * (sample - average)


class Homes:
    """Where the active sessions are (module docstring): a session counts on the backend its latest
    turn was sent to while any of its turns runs and ``active_s`` after the last one ends, unless
    another follows. A turn whose end never came holds its session there ``stale_s`` at most, and
    the most recently placed ``max_tracked`` sessions are kept."""

    def __init__(
        self, active_s: float = ACTIVE_S, stale_s: float = 600.0, max_tracked: int = MAX_TRACKED
    ) -> None:
        self.active_s = active_s
        self.stale_s = stale_s
        self.max_tracked = max_tracked
        self._homes: dict[str, _Home] = {}  # oldest placed first
        self._members: dict[str, set[str]] = {}  # backend -> the sessions at home there
        self._ends: deque[tuple[float, str, int]] = deque()  # (ended at, session, its latest turn then)
        self._turns = itertools.count()
        self._think: float | None = None  # the fleet's think time and growth a turn (``_learn``)
        self._growth: float | None = None

    def placed(
        self,
        key: str,
        backend: str,
        now: float,
        *,
        again: bool = False,
        prompt_tokens: int = 0,
        ends_at: float | None = None,
    ) -> None:
        """A turn of ``key`` was sent to ``backend`` at ``now``: the session is at home there, the turn
        running. ``again``: the same request re-routed (after a refusal), not one more turn;
        ``prompt_tokens``: its prompt; ``ends_at``: when its answer is predicted to end."""
        home = self._homes.pop(key, None)
        running = 0 if again else 1
        if home is not None:
            self._uncount(home.backend, key)
            running += home.running
        new = _Home(backend, now, next(self._turns), max(running, 1))
        new.prompt = prompt_tokens
        new.ends_at = now if ends_at is None else ends_at
        if home is not None:
            new.growth, new.think = home.growth, home.think
            if not again:
                self._learn(new, home, now, prompt_tokens)
            if home.running > (1 if again else 0):  # beside another turn still running: the
                # session is ready when both have ended. One end is kept a session, not one a turn
                # (``ended`` does not say which turn ended): a re-route of the later turn, or a turn
                # ending early, leaves the later prediction until the session's last turn ends
                new.ends_at = max(new.ends_at, home.ends_at)
        self._homes[key] = new
        self._members.setdefault(backend, set()).add(key)
        if len(self._homes) > self.max_tracked:
            self._leave(next(iter(self._homes)))

    def ended(self, key: str, now: float) -> None:
        """A turn of ``key`` ended at ``now``: once none runs, the session stays ``active_s`` more."""
        home = self._homes.get(key)
        if home is None:
            return
        home.running = max(home.running - 1, 0)
        if home.running == 0:
            home.ended_at = now
            self._ends.append((now, key, home.turn))

    def counts(self, now: float, excluding: str | None = None) -> dict[str, int]:
        """Sessions at home on each backend at ``now``, ``excluding`` one (the session being routed)."""
        horizon = now - self.active_s
        while self._ends and self._ends[0][0] < horizon:
            _, key, turn = self._ends.popleft()
            home = self._homes.get(key)
            if home is not None and home.turn == turn and home.running == 0:  # no turn since
                self._leave(key)
        while self._homes and next(iter(self._homes.values())).at < now - self.stale_s:
            self._leave(next(iter(self._homes)))
        counts = {backend: len(keys) for backend, keys in self._members.items()}
        home = self._homes.get(excluding) if excluding is not None else None
        if home is not None:
            counts[home.backend] -= 1
        return {backend: n for backend, n in counts.items() if n > 0}

    def coming(self, now: float, excluding: str | None = None) -> dict[str, tuple[NextTurn, ...]]:
        """The next turns of the sessions at home on each backend (``counts`` first: it drops the
        ones gone quiet), ``excluding`` one; a session's own think time and growth, else the fleet's;
        none before any sample of either."""
        turns: dict[str, list[NextTurn]] = {}
        for key, home in self._homes.items():
            think = home.think if home.think is not None else self._think
            growth = home.growth if home.growth is not None else self._growth
            if key == excluding or think is None or growth is None:
                continue
            ready = home.ends_at if home.running or home.ended_at is None else home.ended_at
            turn = NextTurn(ready_at=ready, think_s=think, tokens=round(growth), cached=home.prompt)
            turns.setdefault(home.backend, []).append(turn)
        return {backend: tuple(found) for backend, found in turns.items()}

    def _learn(self, new: _Home, old: _Home, now: float, prompt_tokens: int) -> None:
        """``new``'s think time and growth after its previous turn ``old``: the time since that one
        ended (none while one still runs) and the tokens the prompt added."""
        if old.running == 0 and old.ended_at is not None:
            think = max(now - old.ended_at, 0.0)
            new.think = _mean(new.think, think, TURN_WEIGHT)
            self._think = _mean(self._think, think, FLEET_WEIGHT)
        if old.prompt > 0 and prompt_tokens > old.prompt:
            growth = float(prompt_tokens - old.prompt)
            new.growth = _mean(new.growth, growth, TURN_WEIGHT)
            self._growth = _mean(self._growth, growth, FLEET_WEIGHT)

    def _leave(self, key: str) -> None:
        home = self._homes.pop(key, None)
        if home is not None:
            self._uncount(home.backend, key)

    def _uncount(self, backend: str, key: str) -> None:
        members = self._members.get(backend)
        if members is not None:
            members.discard(key)
            if not members:
                del self._members[backend]


FOLLOW_WINDOW = 100
"""First turns the follow-up rate remembers (exponentially: older ones weigh less)."""
FAMILY_PRIOR = 1.0
"""How many first turns the global follow-up rate counts for in a prompt family's (the family's own
rate starts there and moves off it with each of its first turns). Issue #45, contention-2-nosession
over 32 draws: 0.5 and 1 gave a mean TTFT of 1.136 s (was 1.155) and a worst draw 1.10x the best
peer's (was 1.12x); 2 and 4 gave 1.138 and 1.147 s, seed 15 still 1.12x (docs/benchmarks.md)."""
MAX_FAMILIES = 10_000
"""A bound on the prompt families tracked (a dict entry each); beyond it the least recently seen go."""


class _Counts:
    """Decayed first turns and the follow-ups among them."""

    __slots__ = ("first", "followed")

    def __init__(self) -> None:
        self.first = 0.0
        self.followed = 0.0

    def first_turn(self, decay: float) -> None:
        self.first = self.first * decay + 1.0
        self.followed *= decay

    def second_turn(self) -> None:
        self.followed = min(self.followed + 1.0, self.first)


class FollowUps:
    """How often a conversation known only by its content (no session id) comes back after its
    first turn: agents do, one-off requests do not. Routing lets a first turn look ahead by this
    chance while a llama.cpp slot is free (``policies.context.RoutingContext.follow_rate``).

    Counts decay by ``1 - 1 / window`` per first turn, so the rate follows the traffic of the last
    ``window`` or so; it starts at 1/2 (one imagined follow-up in two first turns).

    The rate is also kept per prompt family (``policies.prefix.PromptChain.family``: the first 4 KB,
    an agent harness's tool list and system prompt), where traffic of both kinds shares one gateway:
    an agent's first turn follows its harness's record, a one-off request its own prompt's. A family's
    rate is its follow-ups over its first turns with the global rate counted as ``prior`` first turns
    of it (the mean of a beta prior of that weight): a family seen once is at the global rate, one
    seen often at its own."""

    def __init__(
        self, window: int = FOLLOW_WINDOW, prior: float = FAMILY_PRIOR, max_families: int = MAX_FAMILIES
    ) -> None:
        self._decay = 1.0 - 1.0 / window
        self.prior = prior
        self.max_families = max_families
        self._all = _Counts()
        self._families: dict[int, _Counts] = {}

    def first_turn(self, family: int | None = None) -> None:
        self._all.first_turn(self._decay)
        if family is not None:
            counts = self._families.pop(family, None) or _Counts()
            self._families[family] = counts  # the most recently seen last
            counts.first_turn(self._decay)
            if len(self._families) > self.max_families:
                del self._families[next(iter(self._families))]

    def second_turn(self, family: int | None = None) -> None:
        """A conversation's second turn (its family, the first turn's: it extends that prompt)."""
        self._all.second_turn()
        counts = self._families.get(family) if family is not None else None
        if counts is not None:
            counts.second_turn()

    @property
    def rate(self) -> float:
        """Over every family."""
        return (self._all.followed + 1.0) / (self._all.first + 2.0)

    def rate_for(self, family: int | None) -> float:
        """The chance a first turn of ``family``, counted already (``first_turn``), comes back: its
        family's record but for itself, weighed with the global rate (class docstring)."""
        counts = self._families.get(family) if family is not None else None
        if counts is None:
            return self.rate
        earlier = max(counts.first - 1.0, 0.0)
        return (counts.followed + self.prior * self.rate) / (earlier + self.prior)
