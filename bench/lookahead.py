"""Where ``cost`` sits between the best published router and the look-ahead oracle (issue #45), in
virtual time, on the first draws of the routing benchmark's rows.

    .venv/bin/python bench/lookahead.py [--draws N] [--only NAME ...] [--jobs N] [--json F]

The routing benchmark's greedy oracle is beaten by ``cost`` on several rows, so it bounds nothing.
The look-ahead oracle (``gateway/replay/virtual_lookahead.py``) plays each request's best
candidates to the end of the trace on copies of the world and keeps the one with the least TTFT
total: its mean TTFT is at most the greedy oracle's, by construction. It costs copies played to the
end per request (quadratic in the trace), so it runs here on the first ``--draws`` draws of each row
(default 4), not in ``bench/routing.py``'s 32. Each draw replays ``cost``, every published router
of the row (``policies.peers``), the greedy oracle and the look-ahead oracle; a row pools its draws
(every request counts once) and prints, on mean TTFT:

* ``best peer``: the best published router's mean (each draw's best peer pooled is not a router a
  user could run: the row takes the peer with the best pooled mean);
* ``cost / best peer`` and ``cost / look-ahead``;
* ``closed``: how much of the gap from the best peer to the look-ahead oracle ``cost`` closes
  (1.0: all of it; above 1: ``cost`` beat the look-ahead too).

The rows: the two-engine workstation's generated rows (not Mooncake: 12,031 requests) and, with
``--only``, any other generated row. Everything is deterministic: one run is the answer.
"""

from __future__ import annotations

import argparse
import concurrent.futures
import itertools
import json
import os
import statistics
import sys
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from routing import positive_int, workload_settings
from routing_workloads import MODEL, PEERS, WORKLOADS

from gateway.logging import configure_logging
from gateway.replay.results import LOOKAHEAD, ORACLE, Result
from gateway.replay.simulate import simulate
from gateway.replay.traces import with_model
from gateway.replay.virtual_world import VirtualOptions

ROWS = (
    "chat", "mixed", "contention-1", "contention-1-nosession", "contention-2", "contention-2-nosession",
    "contention-4", "contention-4-nosession", "contention-8", "contention-8-nosession",
)  # fmt: skip
"""The default rows: the workstation's generated rows but Mooncake."""


def _draw(name: str, seed: int) -> dict[str, Any]:
    """Draw ``seed`` of row ``name``: per run, every request's TTFT (None: failed), and wall seconds."""
    workload = next(w for w in WORKLOADS if w.name == name)
    assert workload.seeded is not None
    requests = with_model(workload.seeded(seed), MODEL)
    profiles = ["cost", *(p for p in workload.profiles if p in PEERS)]
    runs = simulate(requests, profiles, workload_settings(workload), MODEL, VirtualOptions(), lookahead=True)
    ttfts = {run: _ttfts(results) for run, results in runs.runs.items()}
    return {"seed": seed, "requests": len(requests), "runs": ttfts, "wall_s": runs.wall_s}


def _ttfts(results: Sequence[Result]) -> list[float | None]:
    return [r.ttft_s if r.ok else None for r in results]


def _mean(values: Sequence[float | None]) -> float:
    """Mean TTFT, a failed request counted as infinitely slow (a run that lost one is not a yardstick)."""
    if any(v is None for v in values):
        return float("inf")
    return statistics.fmean(v for v in values if v is not None)


def summarize(name: str, draws: Sequence[dict[str, Any]]) -> dict[str, Any]:
    """One row: pooled mean TTFT per run, the best peer, and the ratios of the module docstring."""
    pooled = {
        run: _mean(list(itertools.chain.from_iterable(d["runs"][run] for d in draws)))
        for run in draws[0]["runs"]
    }
    peers = {run: value for run, value in pooled.items() if run in PEERS}
    best = min(peers, key=lambda run: peers[run])
    cost, peer, ahead = pooled["cost"], peers[best], pooled[LOOKAHEAD]
    gap = peer - ahead
    return {
        "row": name,
        "draws": [d["seed"] for d in draws],
        "requests": sum(d["requests"] for d in draws),
        "mean_ttft_s": {run: round(value, 4) for run, value in pooled.items()},
        "best_peer": best,
        "cost_vs_peer": round(cost / peer, 4),
        "cost_vs_lookahead": round(cost / ahead, 4),
        "lookahead_vs_peer": round(ahead / peer, 4),
        "lookahead_vs_oracle": round(ahead / pooled[ORACLE], 4),
        "closed": round((peer - cost) / gap, 3) if gap > 0 else None,
        "per_draw": [
            {
                "seed": d["seed"],
                "cost": round(_mean(d["runs"]["cost"]), 4),
                "best_peer": round(min(_mean(d["runs"][p]) for p in peers), 4),
                ORACLE: round(_mean(d["runs"][ORACLE]), 4),
                LOOKAHEAD: round(_mean(d["runs"][LOOKAHEAD]), 4),
            }
            for d in draws
        ],
        "wall_s": round(sum(sum(d["wall_s"].values()) for d in draws), 1),
        "lookahead_wall_s": round(sum(d["wall_s"][LOOKAHEAD] for d in draws), 1),
    }


def markdown(rows: Sequence[dict[str, Any]]) -> str:
    """The rows as a table, then each row's draws."""
    lines = [
        "| row | draws | requests | best peer | best peer s | cost s | oracle s | look-ahead s "
        "| cost / best peer | cost / look-ahead | look-ahead / best peer | closed |",
        "|---|---:|---:|---|---:|---:|---:|---:|---:|---:|---:|---:|",
    ]
    for row in rows:
        means = row["mean_ttft_s"]
        closed = "-" if row["closed"] is None else f"{row['closed']:.2f}"
        lines.append(
            f"| {row['row']} | {len(row['draws'])} | {row['requests']} | {row['best_peer']} "
            f"| {means[row['best_peer']]:.3f} | {means['cost']:.3f} | {means[ORACLE]:.3f} "
            f"| {means[LOOKAHEAD]:.3f} | {row['cost_vs_peer']:.2f}x | {row['cost_vs_lookahead']:.2f}x "
            f"| {row['lookahead_vs_peer']:.2f}x | {closed} |"
        )
    lines.append("")
    for row in rows:
        draws = ", ".join(
            f"{d['seed']}: cost {d['cost']:.3f} / peer {d['best_peer']:.3f} / look-ahead {d[LOOKAHEAD]:.3f}"
            for d in row["per_draw"]
        )
        lines.append(
            f"- {row['row']} (mean TTFT s by draw; {row['lookahead_wall_s']:.0f} s of look-ahead): {draws}"
        )
    return "\n".join(lines)


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    generated = [w.name for w in WORKLOADS if w.seeded is not None]
    parser.add_argument("--draws", type=positive_int, default=4, help="draws per row from seed 0 (default 4)")
    parser.add_argument("--only", action="append", choices=generated, default=None)
    parser.add_argument("--jobs", type=positive_int, default=os.cpu_count() or 1)
    parser.add_argument("--json", type=Path, default=None, help="write the rows here too")
    args = parser.parse_args(argv)
    configure_logging("json", "warning")
    names = args.only or list(ROWS)
    tasks = [(name, seed) for name in names for seed in range(args.draws)]
    started = time.monotonic()
    with concurrent.futures.ProcessPoolExecutor(
        max_workers=args.jobs, initializer=configure_logging, initargs=("json", "warning")
    ) as pool:
        done = list(pool.map(_draw, *zip(*tasks, strict=True)))
    rows = [
        summarize(name, [d for (n, _), d in zip(tasks, done, strict=True) if n == name]) for name in names
    ]
    print(markdown(rows))
    print(f"\n{len(tasks)} draws in {time.monotonic() - started:.0f} wall s", file=sys.stderr)
    if args.json is not None:
        args.json.write_text(json.dumps(rows, indent=2) + "\n", encoding="utf-8")
    return 0


if __name__ == "__main__":
    sys.exit(main())
