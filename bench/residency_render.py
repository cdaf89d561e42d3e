"""bench/residency.py's table in Markdown, with what it concludes (issue #62, item 4)."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any


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
    statics = [s for s in statics if alt[s]["served"]]
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
