"""What the streaming soak (``bench/soak.py``) saw and how it is judged: each stream's record
(``Stream``) and each side's tally of them against the expected answers (``Tally``: failed streams,
bytes lost, duplicated or altered), turnout's garbage-collector pauses read off its ``/metrics``
(``gc_pauses``), and the report (``report``): the summary written with ``--json``, the printed lines
and whether the run passed.
"""

from __future__ import annotations

import argparse
import math
from dataclasses import dataclass, field
from typing import Any

from prometheus_client.parser import text_string_to_metric_families


@dataclass
class Stream:
    ttft: float | None
    total: float
    longest_gap: float
    content: str
    done: int
    error: str | None = None


@dataclass
class Tally:
    """What one side (through turnout, or direct) saw."""

    streams: list[Stream] = field(default_factory=list)
    failed: list[str] = field(default_factory=list)
    lost: int = 0
    duplicated: int = 0
    wrong: int = 0

    def check(self, stream: Stream, expected: str) -> None:
        self.streams.append(stream)
        if stream.error is not None or stream.done != 1:
            self.failed.append(stream.error or f"[DONE] seen {stream.done} times")
        got, want = stream.content.encode(), expected.encode()
        self.lost += max(0, len(want) - len(got))
        self.duplicated += max(0, len(got) - len(want))
        if got != want and len(got) == len(want):
            self.wrong += 1


def gc_pauses(exposition: str) -> dict[str, dict[str, float]]:
    """Per generation, from turnout's ``turnout_gc_pause_seconds``: collections, seconds in all, and
    the smallest bucket bound every pause was under."""
    samples = [
        sample
        for family in text_string_to_metric_families(exposition)
        if family.name == "turnout_gc_pause_seconds"
        for sample in family.samples
    ]
    pauses: dict[str, dict[str, float]] = {}
    for sample in samples:
        mine = pauses.setdefault(sample.labels["generation"], {})
        if sample.name.endswith("_count"):
            mine["collections"] = sample.value
        elif sample.name.endswith("_sum"):
            mine["seconds"] = round(sample.value, 3)
    for sample in samples:  # cumulative buckets, ascending: the first that holds them all
        mine = pauses[sample.labels["generation"]]
        done = "longest_under_s" in mine or sample.value < mine.get("collections", 0)
        if sample.name.endswith("_bucket") and not done:
            mine["longest_under_s"] = float(sample.labels["le"])
    return pauses


def pct(values: list[float], p: float) -> float:
    if not values:
        return math.nan
    values = sorted(values)
    return values[min(len(values) - 1, round((len(values) - 1) * p / 100))]


def report(args: argparse.Namespace, result: dict[str, Any]) -> tuple[str, dict[str, Any], bool]:
    through, direct, rss, cpu = result["through"], result["direct"], result["rss"], result["cpu"]
    core = (cpu.get("end", math.nan) - cpu.get("open", math.nan)) / (
        cpu.get("ended_at", math.nan) - cpu.get("opened_at", math.nan)
    )  # share of one core while every stream was open

    def timings(tally: Tally) -> dict[str, float]:
        ok = [s for s in tally.streams if s.error is None and s.ttft is not None]
        ttft, total = [s.ttft for s in ok if s.ttft is not None], [s.total for s in ok]
        return {
            "ttft_p50_ms": pct(ttft, 50) * 1000,
            "ttft_p99_ms": pct(ttft, 99) * 1000,
            "total_p50_ms": pct(total, 50) * 1000,
            "total_p99_ms": pct(total, 99) * 1000,
        }

    mine, floor = timings(through), timings(direct)
    stalls = sum(1 for s in through.streams if s.longest_gap > args.stall_s)
    growth = rss.get("end", math.nan) / rss.get("open", math.nan) - 1
    summary = {
        "streams": args.streams,
        "minutes": args.minutes,
        "completed": len(through.streams),
        "failed": len(through.failed),
        "failures": sorted(set(through.failed))[:5],
        "lost_bytes": through.lost,
        "duplicated_bytes": through.duplicated,
        "wrong_content": through.wrong,
        "stalls": stalls,
        "rss_mib": {k: round(v, 1) for k, v in rss.items()},
        "rss_growth": round(growth, 3),
        "cpu_core_share": round(core, 3),
        "gc_pauses": result["gc"],
        "through": {k: round(v, 1) for k, v in mine.items()},
        "direct": {k: round(v, 1) for k, v in floor.items()},
        "added_p99_ms": {
            "ttft": round(mine["ttft_p99_ms"] - floor["ttft_p99_ms"], 1),
            "total": round(mine["total_p99_ms"] - floor["total_p99_ms"], 1),
        },
        "direct_completed": len(direct.streams),
        "direct_failed": len(direct.failed),
    }
    ok = (
        not through.failed
        and through.lost == 0
        and through.duplicated == 0
        and through.wrong == 0
        and stalls == 0
        and abs(growth) <= 0.10
    )
    lines = [
        f"Soak: {args.streams} concurrent streams x {args.minutes:g} min through turnout "
        f"({args.tokens} tokens at {args.decode_tok_s:g} tok/s each), {args.probes} direct for comparison",
        f"- streams completed {len(through.streams):,}, failed {len(through.failed)}"
        + (f" ({'; '.join(summary['failures'])})" if through.failed else ""),
        f"- bytes lost {through.lost}, duplicated {through.duplicated}, answers altered {through.wrong}",
        f"- turnout RSS: {rss['idle']:.0f} MiB idle, {rss.get('open', math.nan):.0f} MiB with every stream "
        f"open, {rss.get('end', math.nan):.0f} MiB at the end ({growth:+.1%}), peak "
        f"{rss.get('peak', math.nan):.0f} MiB",
        f"- turnout CPU while every stream was open: {core:.1%} of one core",
        "- turnout's garbage collector: "
        + ", ".join(
            f"gen{g} {p.get('collections', 0):,.0f} collections, {p.get('seconds', 0) * 1000:,.0f} ms, "
            f"longest <= {p.get('longest_under_s', 0):g} s"
            for g, p in sorted(result["gc"].items())
        ),
        f"- stalls (a gap over {args.stall_s:g} s between events): {stalls}",
        "| | TTFT p50 | TTFT p99 | total p50 | total p99 |",
        "| --- | ---: | ---: | ---: | ---: |",
        *(
            f"| {name} | {t['ttft_p50_ms']:.1f} ms | {t['ttft_p99_ms']:.1f} ms | "
            f"{t['total_p50_ms']:.0f} ms | {t['total_p99_ms']:.0f} ms |"
            for name, t in (("through turnout", mine), ("direct", floor))
        ),
        f"- added p99: TTFT {summary['added_p99_ms']['ttft']:+.1f} ms, total "
        f"{summary['added_p99_ms']['total']:+.1f} ms",
        f"- {'PASS' if ok else 'FAIL'}: nothing lost, duplicated or failed, no stall; RSS flat within 10%",
    ]
    return "\n".join(lines), summary, ok
