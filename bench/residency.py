"""What switching the workstation's GPUs between engines could win, in virtual time (issue #62, item 4;
docs/residency.md, "Does switching pay?").

    .venv/bin/python bench/residency.py [--json F] [--out F]

The two 16 GB cards hold one of three members of deploy/residency/'s set at a time; the ``llama``
service (Flash-Next, experts in RAM) runs beside them always. A **static** choice leaves one member
awake for good:

* ``vllm``: the 27B on vLLM (TP2, ``workstation-vllm-27b-tp2``, 16k window with the BF16 KV sleep mode
  needs); Flash-Next on the ``llama`` service (``workstation-llamacpp-flash-next-cpu-moe``).
* ``gguf``: the 27B as a Q4 GGUF on llama.cpp over both cards (``workstation-llamacpp-27b-gpu``);
  Flash-Next as above.
* ``flash-gpu``: Flash-Next with 8 of 48 expert layers on the cards
  (``workstation-llamacpp-flash-next-gpu8``, derived); the 27B is served by nobody. Flash-Next goes to
  this instance alone: its decode and the ``llama`` service's read the same experts with the same CPU,
  so running both would not add decode capacity (the replay's engines do not share a CPU, so it would
  wrongly say they do).

Each phase's trace is replayed on every static choice with the ``cost`` profile (a fresh fleet, cold
caches). Phases: ``agent-27b`` (4 agents x 12 turns, 2k -> 15k tokens), ``chat-27b`` (one-off
questions, 2 every 3 s), ``flash-next`` (2 agents x 8 turns, 2k -> 12k tokens, on Flash-Next), ``both``
(agent-27b and flash-next at once) and ``alternating`` (agent-27b, flash-next, agent-27b, flash-next,
each ``PHASE_S`` after the one before: long enough for a phase to end before the next begins).

The **switching** schedule is the upper bound of any policy: on ``alternating`` it knows each phase's
best static choice in hindsight and switches at each phase change. Each phase is replayed cold on its
best choice (a switch loses vLLM's prefix cache, and a new member starts empty); a switch starts when
the member it frees has served what it was given (the drain), takes the members' free and wake
seconds (``SWITCH_S``: the H100's measurements scaled to the workstation, in the table below), and
every request of the new phase that arrives before it ends waits until then. Targets (issue #62):
where no phase gains 10% over the best static choice, there is no automatic policy to build.

The **automatic** rows run ``policies.residency.decide`` online (``automatic``): at every arrival and
every ``TICK_S`` it sees only what has arrived; its switches are priced as above, the member it frees
draining first; ``automatic, serialized`` makes a moved model's new home wait until its old one (the
``llama`` service) has finished what it was given. The ``val-alternating-*`` traces (``validation``)
were never used to choose the policy's knobs. docs/residency.md, "The automatic policy, tried".
"""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Sequence
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from residency_render import render, stats, summary  # noqa: E402  (bench/residency_render.py)

from backends.engine_profiles import load_profile  # noqa: E402
from gateway.logging import configure_logging  # noqa: E402
from gateway.replay.generate import agent_trace, chat_trace  # noqa: E402
from gateway.replay.report import awaited_s  # noqa: E402
from gateway.replay.results import Result  # noqa: E402
from gateway.replay.simulate import simulate  # noqa: E402
from gateway.replay.traces import TraceRequest  # noqa: E402
from gateway.replay.virtual_world import VirtualOptions  # noqa: E402
from gateway.settings import Settings, load_settings  # noqa: E402
from policies.residency import AutoRules, Demand, Home, Placement, decide  # noqa: E402

SMALL, LARGE = "qwen3.8-27b", "qwen3.8-flash-next"
WINDOW = 16384
BACKENDS = {
    "vllm": ("vllm", "workstation-vllm-27b-tp2"),
    "llama-moe": ("llamacpp", "workstation-llamacpp-flash-next-cpu-moe"),
    "llama-27b": ("llamacpp", "workstation-llamacpp-27b-gpu"),
    "llama-flash-gpu": ("llamacpp", "workstation-llamacpp-flash-next-gpu8"),
}
STATICS: dict[str, dict[str, str | None]] = {
    "vllm": {SMALL: "vllm", LARGE: "llama-moe"},
    "gguf": {SMALL: "llama-27b", LARGE: "llama-moe"},
    "flash-gpu": {SMALL: None, LARGE: "llama-flash-gpu"},
}
SWITCH_S = {"vllm": (1.0, 1.2), "gguf": (0.3, 3.0), "flash-gpu": (0.3, 3.6)}
"""Seconds to free the cards, and to take them, per member [E]. vLLM, sleep level 1: 1.0 s after the
first (28 s the first time, once per process), wake 1.2 s (the H100, docs/calibrate.md). A router-mode
llama-server model: unload 0.3 s; load at the H100's 5.5 GB/s from the page cache (Q8_0: 28.7 GB in
5.2 s) of what goes on the cards: the 27B's 16.5 GB (3.0 s), Flash-Next's 8 expert layers and its
other weights, ~20 GB (3.6 s)."""
PHASE_S = 600.0
MEMBER = {"vllm": "vllm", "gguf": "llama-27b", "flash-gpu": "llama-flash-gpu"}
"""The residency set's member each static choice wakes (the ``llama`` service stays up in every one)."""
FIRST = "vllm"
"""The member awake at the start of every run of the automatic policy: deploy/residency/turnout.toml's."""
AUTO = AutoRules()
TICK_S = 5.0
"""How often the automatic policy is asked, besides at each arrival (it is not wired into the gateway)."""


def phase_traces() -> dict[str, list[TraceRequest]]:
    agents = agent_trace(agents=4, turns=12, seed=1, model=SMALL, start_tokens=2000, max_context=15000)
    chat = chat_trace(requests=80, duration=120.0, seed=1, model=SMALL)
    flash = agent_trace(agents=2, turns=8, seed=2, model=LARGE, start_tokens=2000, max_context=12000)
    both = sorted([*agents, *flash], key=lambda r: r.t)
    return {"agent-27b": agents, "chat-27b": chat, "flash-next": flash, "both": both}


def alternating(phases: dict[str, list[TraceRequest]]) -> list[tuple[str, list[TraceRequest]]]:
    """agent-27b, flash-next, agent-27b, flash-next, each ``PHASE_S`` after the one before (its own
    sessions: the second agent phase's agents are new ones)."""
    out = []
    for index, name in enumerate(("agent-27b", "flash-next", "agent-27b", "flash-next")):
        shift = index * PHASE_S
        trace = [
            replace(r, t=r.t + shift, session=f"{r.session}-{index}" if r.session else None)
            for r in phases[name]
        ]
        out.append((name, trace))
    return out


def fleet(static: str) -> Settings:
    """The gateway and its fleet when ``static`` holds the cards (module docstring)."""
    placed = STATICS[static]
    used = sorted({b for b in placed.values() if b is not None})
    backends = [
        {"id": b, "kind": BACKENDS[b][0], "url": f"http://{b}.virtual", "engine_profile": BACKENDS[b][1],
         **({"sim": {"slots": 2}} if BACKENDS[b][0] == "llamacpp" else {})}
        for b in used
    ]  # fmt: skip
    models = [
        {"name": model, "architecture": "hybrid",
         "deployments": [{"backend": backend, "upstream_name": model, "context_window": WINDOW}]}
        for model, backend in placed.items()
        if backend is not None
    ]  # fmt: skip
    return load_settings(None, profile="cost", backends=backends, models=models)


def replay(trace: Sequence[TraceRequest], static: str) -> list[Result] | None:
    """``trace`` on ``static`` with the cost profile; None where that choice serves none of its models."""
    placed = STATICS[static]
    if any(placed.get(r.model) is None for r in trace):
        return None
    settings = fleet(static)
    runs = simulate(trace, ["cost"], lambda _: settings, trace[0].model, VirtualOptions(), oracle=False)
    return runs.runs["cost"]


def validation() -> dict[str, list[TraceRequest]]:
    """Alternating traffic of other shapes and seeds, kept apart from the rows the automatic policy's
    knobs were chosen on (``AutoRules``' defaults): 3 agents on each model, the 27B's from 3k tokens,
    Flash-Next's shorter sessions (6 turns from 1.5k)."""
    out = {}
    for seed in (7, 8):
        phases = {
            "agent-27b": agent_trace(
                agents=3, turns=10, seed=seed, model=SMALL, start_tokens=3000, max_context=14000
            ),
            "flash-next": agent_trace(
                agents=3, turns=6, seed=seed + 100, model=LARGE, start_tokens=1500, max_context=10000
            ),
        }
        out[f"val-alternating-{seed}"] = sorted(
            (r for _, t in alternating(phases) for r in t), key=lambda r: r.t
        )
    return out


def placements() -> dict[str, Placement]:
    """Each static choice as the automatic policy sees it: where each model goes, the switch seconds."""
    return {
        static: Placement(
            member=static,
            serves={m: Home(b, load_profile(BACKENDS[b][1])) for m, b in placed.items() if b is not None},
            free_s=SWITCH_S[static][0],
            wake_s=SWITCH_S[static][1],
        )
        for static, placed in STATICS.items()
    }


def scheduled(
    trace: Sequence[TraceRequest], decisions: Sequence[tuple[float, str]], first: str, *, overlap: bool = True
) -> dict[str, Any]:
    """``trace`` served by ``first``, then by each decision's member from its time on: each stretch
    replayed cold on its member (a switch loses vLLM's prefix cache, and a new member starts empty);
    a switch starts once the member it frees has served what it was given (the drain), takes the
    members' free and wake seconds (``SWITCH_S``), and the requests of the models that move wait until
    it ends. ``overlap``: a moved model's new home starts while its old home (outside the set: the
    ``llama`` service) still works through what it was given, as two engines that share nothing;
    without, it waits for the old home to finish (Flash-Next's two homes read their experts through
    the same CPU and RAM: the truth lies between the two)."""
    homes = placements()
    awake, start, ready = first, float("-inf"), 0.0
    switches, switching_s = 0, 0.0
    merged = Merged()
    held: dict[str, float] = {}
    for at, target in [*decisions, (float("inf"), first)]:
        part = [r for r in trace if start <= r.t < at]
        ends = _stretch(part, awake, held, merged)
        if at == float("inf"):
            break
        took = SWITCH_S[awake][0] + SWITCH_S[target][1]
        ready = max(at, ready, ends.get(MEMBER[awake], 0.0)) + took  # after the switch before it, too
        old = STATICS[awake]
        held = {
            m: ready if overlap else max(ready, ends.get(old.get(m) or "", 0.0))
            for m, h in homes[target].serves.items()
            if old.get(m) != h.backend
        }
        switches, switching_s = switches + 1, switching_s + took
        awake, start = target, at
    return {
        "served": True,
        "requests": len(merged.ttft),
        "errors": merged.errors,
        **stats(merged.raw()),
        "switches": switches,
        "switching_s": round(switching_s, 2),
    }


@dataclass
class Merged:
    """What the stretches of a schedule add up to: each request's times, each session's first
    arrival and last answer across every stretch it spans (a session that lives through a switch is
    one session), and the requests that failed."""

    ttft: list[float] = field(default_factory=list)
    awaited: list[float] = field(default_factory=list)
    spans: dict[str, list[float]] = field(default_factory=dict)
    errors: int = 0

    def raw(self) -> dict[str, list[float]]:
        sessions = [end - first for first, end in self.spans.values()]
        return {"ttft": self.ttft, "awaited": self.awaited, "session": sessions}


def _stretch(
    part: Sequence[TraceRequest], member: str, held: dict[str, float], merged: Merged
) -> dict[str, float]:
    """``part`` replayed on ``member``, each model's requests held until ``held[model]`` (the switch
    before it); adds each request's times to ``merged``; when each backend's last request ended."""
    if not part:
        return {}
    waits = [max(0.0, held.get(r.model, 0.0) - r.t) for r in part]
    moved = [replace(r, t=r.t + w) for r, w in zip(part, waits, strict=True)]
    results = replay(moved, member)
    if results is None:
        raise ValueError(f"{member} serves none of {sorted({r.model for r in part})}")
    done = [r for r in results if r.ok]
    merged.errors += len(results) - len(done)
    agents = [r.agent for r in part]
    ends: dict[str, float] = {}
    for r in done:
        merged.ttft.append((r.ttft_s or 0.0) + waits[r.index])
        merged.awaited.append(awaited_s(r, agents) + waits[r.index])
        session = part[r.index].session
        if session:
            span = merged.spans.setdefault(str(session), [part[r.index].t, 0.0])
            span[0], span[1] = min(span[0], part[r.index].t), max(span[1], r.end_s + waits[r.index])
        backend = STATICS[member][part[r.index].model] or ""
        ends[backend] = max(ends.get(backend, 0.0), r.end_s)
    return ends


def hindsight(parts: list[tuple[str, list[TraceRequest]]], best: dict[str, str]) -> dict[str, Any]:
    """The upper bound of any policy on the alternating trace: each phase on its best static choice,
    a switch at each phase's first request."""
    decisions, awake = [], best[parts[0][0]]
    for name, trace in parts[1:]:
        if best[name] != awake:
            decisions.append((trace[0].t, best[name]))
            awake = best[name]
    whole = sorted((r for _, t in parts for r in t), key=lambda r: r.t)
    return scheduled(whole, decisions, best[parts[0][0]])


def automatic(
    trace: Sequence[TraceRequest], first: str, rules: AutoRules = AUTO, *, overlap: bool = True
) -> dict[str, Any]:
    """``trace`` under the automatic policy (policies/residency.py), run online: at every request's
    arrival and every ``TICK_S`` it sees only the requests that have arrived, as a gateway would; while
    a switch it asked for still runs (its free and wake seconds) it only queues the switch back that
    homeless demand needs, for when that one ends."""
    homes = placements()
    awake, last, busy_until = first, None, float("-inf")
    decisions: list[tuple[float, str]] = []
    seen: list[Demand] = []
    times = sorted({*(r.t for r in trace), *_ticks(trace)})
    arrivals = iter(trace)
    pending = next(arrivals, None)
    for now in times:
        while pending is not None and pending.t <= now:
            seen.append(
                Demand(pending.t, pending.model, pending.input_tokens, pending.max_tokens, pending.session)
            )
            pending = next(arrivals, None)
        verdict = decide(now, awake, homes, seen, last, rules)
        if verdict.target is None or (now < busy_until and not verdict.homeless):
            continue
        at = max(now, busy_until)  # homeless demand during a switch: the switch back once it ends
        decisions.append((at, verdict.target))
        busy_until = at + SWITCH_S[awake][0] + SWITCH_S[verdict.target][1]
        awake, last = verdict.target, at
    out = scheduled(trace, decisions, first, overlap=overlap)
    out["decisions"] = [(round(t, 1), m) for t, m in decisions]
    return out


def _ticks(trace: Sequence[TraceRequest]) -> list[float]:
    start, end = trace[0].t, trace[-1].t + AUTO.window_s
    return [start + k * TICK_S for k in range(int((end - start) / TICK_S) + 1)]


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--json", type=Path, default=None)
    args = parser.parse_args(argv)
    configure_logging("json", "warning")
    phases = phase_traces()
    table: dict[str, dict[str, Any]] = {}
    for name, trace in phases.items():
        table[name] = {static: summary(replay(trace, static), trace) for static in STATICS}
    parts = alternating(phases)
    whole = sorted((r for _, t in parts for r in t), key=lambda r: r.t)
    table["alternating"] = {static: summary(replay(whole, static), whole) for static in STATICS}
    best = {
        name: min(
            (s for s in STATICS if table[name][s]["served"]), key=lambda s: table[name][s]["awaited_mean_s"]
        )
        for name in phases
    }
    table["alternating"]["switching (hindsight)"] = hindsight(parts, best)
    for name, trace in [*phases.items(), ("alternating", whole)]:
        table[name]["automatic"] = automatic(trace, FIRST)
        table[name]["automatic, serialized"] = automatic(trace, FIRST, overlap=False)
    for name, trace in validation().items():  # the automatic policy was never tuned on these
        table[name] = {static: summary(replay(trace, static), trace) for static in STATICS}
        table[name]["automatic"] = automatic(trace, FIRST)
        table[name]["automatic, serialized"] = automatic(trace, FIRST, overlap=False)
    print(render(table, best, list(STATICS)))
    if args.json is not None:
        args.json.write_text(json.dumps({"phases": table, "best": best}, indent=2) + "\n", encoding="utf-8")
    return 0


if __name__ == "__main__":
    sys.exit(main())
