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

from gateway.logging import configure_logging  # noqa: E402
from gateway.replay.generate import agent_trace, chat_trace  # noqa: E402
from gateway.replay.report import awaited_s  # noqa: E402
from gateway.replay.results import Result  # noqa: E402
from gateway.replay.simulate import simulate  # noqa: E402
from gateway.replay.traces import TraceRequest  # noqa: E402
from gateway.replay.virtual_world import VirtualOptions  # noqa: E402
from gateway.settings import Settings, load_settings  # noqa: E402

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


def switching(parts: list[tuple[str, list[TraceRequest]]], best: dict[str, str]) -> dict[str, Any]:
    """The hindsight schedule on the alternating trace (module docstring): each phase on its best
    static choice, a switch at each change, the requests that arrive during a switch held until it ends."""
    awake: str | None = None
    last_end, switches, switching_s = 0.0, 0, 0.0
    merged: dict[str, list[float]] = {"ttft": [], "awaited": [], "session": []}
    for name, trace in parts:
        target = best[name]
        ready = trace[0].t
        if awake is not None and target != awake:
            took = SWITCH_S[awake][0] + SWITCH_S[target][1]
            ready, switches, switching_s = max(ready, last_end) + took, switches + 1, switching_s + took
        awake = target
        waits = [max(0.0, ready - r.t) for r in trace]
        results = replay(trace, target)
        assert results is not None
        done = [r for r in results if r.ok]
        last_end = max(r.end_s + waits[r.index] for r in done)
        for key, values in _raw(done, trace, waits).items():
            merged[key] += values
    return {
        "served": True,
        "requests": len(merged["ttft"]),
        **_stats(merged),
        "switches": switches,
        "switching_s": round(switching_s, 2),
    }


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
    table["alternating"]["switching (hindsight)"] = switching(parts, best)
    print(render(table, best))
    if args.json is not None:
        args.json.write_text(json.dumps({"phases": table, "best": best}, indent=2) + "\n", encoding="utf-8")
    return 0


def render(table: dict[str, dict[str, Any]], best: dict[str, str]) -> str:
    lines = [
        "| phase | holds the cards | mean TTFT | p90 TTFT | mean wait | p90 wait | session | switches (s) |",
        "| --- | --- | --- | --- | --- | --- | --- | --- |",
    ]
    for phase, rows in table.items():
        for static, row in rows.items():
            if not row["served"]:
                lines.append(f"| {phase} | {static} | the 27B is served by nobody | | | | | |")
                continue
            switches = f"{row['switches']} ({row['switching_s']} s)" if "switches" in row else "-"
            lines.append(
                f"| {phase} | {static} | {row['ttft_mean_s']:.3f} | {row['ttft_p90_s']:.3f} | "
                f"{row['awaited_mean_s']:.3f} | {row['awaited_p90_s']:.3f} | {row['session_mean_s']:.1f} | "
                f"{switches} |"
            )
    lines.append("")
    for phase, static in best.items():
        rows = table[phase]
        served = [s for s in STATICS if rows[s]["served"]]
        runner = min(
            (s for s in served if s != static), key=lambda s: rows[s]["awaited_mean_s"], default=None
        )
        if runner is None:
            continue
        gain = 1 - rows[static]["awaited_mean_s"] / rows[runner]["awaited_mean_s"]
        lines.append(f"- {phase}: best {static}, {gain:.0%} under the next best ({runner}) on the mean wait")
    alt = table["alternating"]
    statics = [s for s in STATICS if alt[s]["served"]]
    top = min(statics, key=lambda s: alt[s]["awaited_mean_s"])
    beaten = [
        f"{phase} ({1 - table[phase][s]['awaited_mean_s'] / table[phase][top]['awaited_mean_s']:.0%} by {s})"
        for phase, s in best.items()
        if s != top and table[phase][s]["awaited_mean_s"] <= 0.9 * table[phase][top]["awaited_mean_s"]
    ]
    hind = alt["switching (hindsight)"]
    gain = 1 - hind["awaited_mean_s"] / alt[top]["awaited_mean_s"]
    lines.append(
        f"- the best static choice ({top}) is beaten by 10% or more in: {', '.join(beaten) or 'no phase'}"
        " (issue #62: where it is, an automatic policy may pay)"
    )
    lines.append(
        f"- alternating: switching in hindsight {hind['awaited_mean_s']:.3f} s against {top} "
        f"{alt[top]['awaited_mean_s']:.3f} s: {gain:+.0%} on the mean wait, "
        f"{hind['switches']} switches, {hind['switching_s']} s switching"
    )
    return "\n".join(lines)


if __name__ == "__main__":
    sys.exit(main())
