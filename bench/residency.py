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
the previous phase's last request ended, takes the member's free and wake seconds (``SWITCH_S``: the
H100's measurements scaled to the workstation, in the table below), and every request of the new
phase that arrives before it ends waits until then. Targets (issue #62): where no phase gains 10% over
the best static choice, there is no automatic policy to build.

The **automatic** rows run ``policies.residency.decide`` online (``automatic``): at every arrival and
every ``TICK_S`` it sees only what has arrived; its switches are priced as above, the member it frees
draining first; ``automatic, serialized`` makes a moved model's new home wait until its old one (the
``llama`` service) has finished what it was given. The ``val-alternating-*`` traces (``validation``)
were never used to choose the policy's knobs. docs/residency.md, "The automatic policy, tried".
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
from collections.abc import Sequence
from dataclasses import replace
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from residency_render import render  # noqa: E402  (bench/residency_render.py)

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
"""How often the gateway asks the automatic policy (``gateway.residency_auto``), besides each arrival."""


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


def summary(
    results: Sequence[Result] | None, trace: Sequence[TraceRequest], extra: Sequence[float] = ()
) -> dict[str, Any]:
    """Mean and p90 of the TTFT and of what each client waits for (an agent's call: its last token),
    and the mean session completion (a session's first arrival to its last answer); ``extra``:
    seconds each request waited for a switch, added to each."""
    if results is None:
        return {"served": False}
    done = [r for r in results if r.ok]
    waits = list(extra) or [0.0] * len(trace)
    return {
        "served": True,
        "requests": len(done),
        "errors": len(results) - len(done),
        **_times(done, trace, waits),
        "end_s": round(max(r.end_s + waits[r.index] for r in done), 3),
    }


def _raw(
    done: Sequence[Result], trace: Sequence[TraceRequest], waits: Sequence[float]
) -> dict[str, list[float]]:
    """Each request's TTFT and wait, each session's span (switch waits included)."""
    agents = [r.agent for r in trace]
    sessions: dict[str, list[Result]] = {}
    for r in done:
        if trace[r.index].session:
            sessions.setdefault(str(trace[r.index].session), []).append(r)
    return {
        "ttft": [(r.ttft_s or 0.0) + waits[r.index] for r in done],
        "awaited": [awaited_s(r, agents) + waits[r.index] for r in done],
        "session": [
            max(r.end_s + waits[r.index] for r in rs) - min(trace[r.index].t for r in rs)
            for rs in sessions.values()
        ],
    }


def _times(done: Sequence[Result], trace: Sequence[TraceRequest], waits: Sequence[float]) -> dict[str, float]:
    return _stats(_raw(done, trace, waits))


def _stats(raw: dict[str, list[float]]) -> dict[str, float]:
    return {
        "ttft_mean_s": round(statistics.fmean(raw["ttft"]), 3),
        "ttft_p90_s": round(_p90(raw["ttft"]), 3),
        "awaited_mean_s": round(statistics.fmean(raw["awaited"]), 3),
        "awaited_p90_s": round(_p90(raw["awaited"]), 3),
        "session_mean_s": round(statistics.fmean(raw["session"]), 1) if raw["session"] else 0.0,
    }


def _p90(values: Sequence[float]) -> float:
    ordered = sorted(values)
    return ordered[max(0, -(-9 * len(ordered) // 10) - 1)]


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
    awake, start = first, float("-inf")
    switches, switching_s = 0, 0.0
    merged: dict[str, list[float]] = {"ttft": [], "awaited": [], "session": []}
    held: dict[str, float] = {}
    for at, target in [*decisions, (float("inf"), first)]:
        part = [r for r in trace if start <= r.t < at]
        ends = _stretch(part, awake, held, merged)
        if at == float("inf"):
            break
        took = SWITCH_S[awake][0] + SWITCH_S[target][1]
        ready = max(at, ends.get(MEMBER[awake], 0.0)) + took
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
        "requests": len(merged["ttft"]),
        **_stats(merged),
        "switches": switches,
        "switching_s": round(switching_s, 2),
    }


def _stretch(
    part: Sequence[TraceRequest], member: str, held: dict[str, float], merged: dict[str, list[float]]
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
    for key, values in _raw(done, part, waits).items():
        merged[key] += values
    ends: dict[str, float] = {}
    for r in done:
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
    arrival and every ``TICK_S`` it sees only the requests that have arrived, as the gateway does, and
    it decides nothing while a switch it asked for still runs (its free and wake seconds)."""
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
        if now < busy_until:
            continue
        verdict = decide(now, awake, homes, seen, last, rules)
        if verdict.target is not None:
            decisions.append((now, verdict.target))
            busy_until = now + SWITCH_S[awake][0] + SWITCH_S[verdict.target][1]
            awake, last = verdict.target, now
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
