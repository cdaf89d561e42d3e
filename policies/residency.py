"""Which member of a residency set should hold the GPUs, from the demand of the last minute (issue #62
item 4; docs/residency.md, "The automatic policy, tried": judged by bench/residency.py and not wired
into the gateway, which switches by demand alone, ``on_demand``).

A residency set's members share the GPUs: one is awake at a time. Each member being awake is a
**placement**: for each model, the engine profile of the best backend that serves it then (the awake
member, or a backend outside the set that is always up); a model no backend serves then is
*homeless*. Its caller keeps what was routed (``Demand``: arrival, model, session, prompt tokens,
expected answer tokens) and asks :func:`decide` every few seconds and at each arrival (bench/residency.py
does). Two rules, in order:

1. **Never leave demand homeless.** A model asked for in the last ``window_s`` that the awake
   placement does not serve makes the set switch at once to the placement that serves every model
   asked for at the least work (or, where none serves them all, the most requests), whatever the
   minimum residence says: a request is waiting for it.
2. **Switch only where it pays.** Otherwise a placement that serves every model asked for is worth
   the switch when the engine seconds it saves over ``horizon_s`` (the window's work on each
   placement, per second, times the horizon) beat ``margin`` times what the switch costs: its
   seconds (the awake member's free and the target's wake) times the requests that arrive meanwhile
   (the window's rate), plus a cold prefill of each live session whose model moves (its warm cache
   stays behind). Never within ``min_residence_s`` of the last switch.

Work is priced at batch 1 from the profiles: a request's prompt beyond what its session's previous
request sent (the engine keeps that: both placements see the same warm turns) plus its answer at one
stream's decode step. Pure: the clock and the demand are passed in.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field

from policies.engine_profile import EngineProfile

HOMELESS = float("inf")


@dataclass(frozen=True)
class Demand:
    """One request the gateway routed: when, for which model, how big."""

    t: float
    model: str
    prompt_tokens: int
    output_tokens: int
    session: str | None = None


@dataclass(frozen=True)
class Home:
    """The backend that serves a model, and how fast."""

    backend: str
    profile: EngineProfile


@dataclass(frozen=True)
class Placement:
    """One member awake: where each model is served then, and the member's switch seconds."""

    member: str
    serves: Mapping[str, Home]
    free_s: float
    wake_s: float


@dataclass(frozen=True)
class AutoRules:
    """The automatic policy's knobs (bench/residency.py's defaults; not in the config: not wired in)."""

    window_s: float = 60.0
    horizon_s: float = 300.0
    margin: float = 1.25
    min_residence_s: float = 60.0


@dataclass(frozen=True)
class Verdict:
    """What :func:`decide` said: the member to wake (None: stay), why, and each placement's work."""

    target: str | None
    why: str
    work_s: Mapping[str, float] = field(default_factory=dict)
    """Engine seconds each placement would spend on the window's demand (inf: a model homeless)."""
    homeless: bool = False
    """The switch is rule 1's: a model asked for has no awake home (it does not wait for anything)."""


def decide(
    now: float,
    awake: str,
    placements: Mapping[str, Placement],
    demand: Sequence[Demand],
    last_switch_at: float | None,
    rules: AutoRules = AutoRules(),
) -> Verdict:
    """The member that should hold the GPUs now (module docstring); ``demand`` oldest first."""
    if rules.window_s <= 0:
        raise ValueError("AutoRules.window_s must be > 0")
    recent = [d for d in demand if now - rules.window_s <= d.t <= now]
    if not recent:
        return Verdict(None, "no demand in the window")
    if awake not in placements:
        return Verdict(None, f"{awake} has no placement")
    work = {name: placement_work(p, recent) for name, p in placements.items()}
    models = {d.model for d in recent}
    here = placements[awake]
    homeless = sorted(m for m in models if m not in here.serves)
    if homeless:
        target = _home(placements, recent, work)
        if target is None or target == awake:
            return Verdict(None, f"{', '.join(homeless)}: no other member serves all that is asked for", work)
        return Verdict(
            target, f"{', '.join(homeless)} asked for and not served by {awake}", work, homeless=True
        )
    if last_switch_at is not None and now - last_switch_at < rules.min_residence_s:
        return Verdict(
            None, f"{awake} woke {now - last_switch_at:.0f} s ago (min {rules.min_residence_s:.0f} s)", work
        )
    best = min((n for n in placements if n != awake), key=lambda n: work[n], default=None)
    if best is None or work[best] == HOMELESS:
        return Verdict(None, "no other member serves every model asked for", work)
    gain = (work[awake] - work[best]) / rules.window_s * rules.horizon_s
    cost = switch_cost(here, placements[best], recent, rules.window_s)
    if gain <= rules.margin * cost:
        return Verdict(None, f"{best} would save {gain:.1f} s, the switch costs {cost:.1f} s", work)
    return Verdict(
        best, f"{best} saves {gain:.1f} s over {rules.horizon_s:.0f} s; the switch costs {cost:.1f} s", work
    )


def placement_work(placement: Placement, demand: Sequence[Demand]) -> float:
    """Engine seconds ``placement`` spends on ``demand`` at batch 1 (inf: a model it does not serve)."""
    total = 0.0
    previous: dict[str, int] = {}  # a session's last prompt and answer: what the engine keeps
    for d in demand:
        home = placement.serves.get(d.model)
        if home is None:
            return HOMELESS
        profile = home.profile
        cached = min(previous.get(d.session, 0), d.prompt_tokens) if d.session else 0
        if d.session:
            previous[d.session] = d.prompt_tokens + d.output_tokens
        total += profile.prefill_seconds(max(d.prompt_tokens - cached, 1), cached)
        total += d.output_tokens * profile.decode_step_seconds(1, d.prompt_tokens)
    return total


def switch_cost(source: Placement, target: Placement, demand: Sequence[Demand], window_s: float) -> float:
    """Seconds a switch from ``source`` to ``target`` costs the traffic (module docstring): the
    requests of the models that move wait out the switch, and their live sessions start cold."""
    moving = {
        m for m, h in target.serves.items() if m not in source.serves or source.serves[m].backend != h.backend
    }
    took = source.free_s + target.wake_s
    arrivals = sum(1 for d in demand if d.model in moving) / window_s * took
    last: dict[str, Demand] = {}
    for d in demand:
        if d.session and d.model in moving:
            last[d.session] = d
    cold = sum(target.serves[d.model].profile.prefill_seconds(d.prompt_tokens) for d in last.values())
    return took * max(arrivals, 1.0) + cold


def _home(
    placements: Mapping[str, Placement], demand: Sequence[Demand], work: Mapping[str, float]
) -> str | None:
    """The placement that serves every model asked for at the least work, else the most requests."""
    whole = [n for n in placements if work[n] != HOMELESS]
    if whole:
        return min(whole, key=lambda n: work[n])
    served = {n: sum(1 for d in demand if d.model in p.serves) for n, p in placements.items()}
    best = max(served, key=lambda n: served[n], default=None)
    return best if best is not None and served[best] else None
