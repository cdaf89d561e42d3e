"""bench/residency.py's figures (each row's means, p90s and sessions) and its table in Markdown, with what
it concludes (issue #62, item 4)."""

from __future__ import annotations

import statistics
from collections.abc import Sequence
from typing import Any

from gateway.replay.report import awaited_s
from gateway.replay.results import Result
from gateway.replay.traces import TraceRequest


def render(table: dict[str, dict[str, Any]], best: dict[str, str], statics: Sequence[str]) -> str:
    """The table and its conclusions, as bench/residency.py prints them (``statics``: its static choices)."""
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
        served = [s for s in statics if rows[s]["served"]]
        runner = min(
            (s for s in served if s != static), key=lambda s: rows[s]["awaited_mean_s"], default=None
        )
        if runner is None:
            continue
        gain = 1 - rows[static]["awaited_mean_s"] / rows[runner]["awaited_mean_s"]
        lines.append(f"- {phase}: best {static}, {gain:.0%} under the next best ({runner}) on the mean wait")
    alt = table["alternating"]
    serving = [s for s in statics if alt[s]["served"]]
    top = min(serving, key=lambda s: alt[s]["awaited_mean_s"])
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
    for phase, rows in table.items():
        if "automatic" not in rows or not any(r.get("switches") for k, r in rows.items() if "automatic" in k):
            continue
        top = min((s for s in statics if rows[s]["served"]), key=lambda s: rows[s]["awaited_mean_s"])
        auto, serial, static = rows["automatic"], rows["automatic, serialized"], rows[top]
        lines.append(
            f"- {phase}: automatic {auto['awaited_mean_s']:.3f} s (serialized "
            f"{serial['awaited_mean_s']:.3f}) against {top} {static['awaited_mean_s']:.3f} s on the mean "
            f"wait; sessions {auto['session_mean_s']:.0f} s ({serial['session_mean_s']:.0f}) against "
            f"{static['session_mean_s']:.0f} s"
        )
    return "\n".join(lines)


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
    return stats(_raw(done, trace, waits))


def stats(raw: dict[str, list[float]]) -> dict[str, float]:
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
