"""``cost`` alone on in-sample rows of bench/routing.py, pooled mean and p90 of TTFT, the last token
and the wait (``awaited``): a quick look while a routing change is being worked out (the validation
set judges it; docs/replay.md).

    .venv/bin/python bench/insample_cost.py [--only chat mixed ...] [--draws 8] [--jobs 2] [--answer-cap]

``--answer-cap`` sends each answer's length as ``max_tokens``, as the replay did before 2026-12-07
(``VirtualOptions.answer_cap``): the router then reads the answer's length from the request.
"""

from __future__ import annotations

import argparse
import concurrent.futures
import itertools
import statistics
import sys
from collections.abc import Sequence
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from routing import workload_settings
from routing_workloads import MODEL, WORKLOADS

from gateway.logging import configure_logging
from gateway.replay.fleets import capacity, sim_configs
from gateway.replay.report import awaited_s, percentile
from gateway.replay.simulate import simulate
from gateway.replay.traces import rate_for_load, with_model, with_rate
from gateway.replay.virtual import VirtualOptions

ROWS = ("chat", "mixed", "contention-4", "mooncake")


def _draw(name: str, seed: int, answer_cap: bool = False) -> list[tuple[float, float, float]]:
    workload = next(w for w in WORKLOADS if w.name == name)
    trace = workload.seeded(seed) if workload.seeded is not None else workload.make(False)
    requests = with_model(trace, MODEL)
    settings_for = workload_settings(workload)
    if workload.load is not None:
        configs = sim_configs(settings_for("cost"), MODEL)
        fleet = capacity(settings_for("cost"), MODEL, configs)
        requests = with_rate(requests, rate_for_load(requests, workload.load, fleet))
    runs = simulate(
        requests, ["cost"], settings_for, MODEL, VirtualOptions(answer_cap=answer_cap), oracle=False
    )
    agents = [r.agent for r in requests]
    return [
        (r.ttft_s, r.completion_s, awaited_s(r, agents))
        for r in runs.runs["cost"]
        if r.ok and r.ttft_s is not None
    ]


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--only", nargs="*", default=list(ROWS))
    parser.add_argument("--draws", type=int, default=8)
    parser.add_argument("--jobs", type=int, default=2)
    parser.add_argument("--answer-cap", action="store_true", help="send each answer's length as max_tokens")
    args = parser.parse_args(argv)
    configure_logging("json", "warning")
    with concurrent.futures.ProcessPoolExecutor(
        args.jobs, initializer=configure_logging, initargs=("json", "warning")
    ) as pool:
        for name in args.only:
            workload = next(w for w in WORKLOADS if w.name == name)
            seeds = range(args.draws) if workload.seeded is not None else range(1)
            times = [
                t
                for part in pool.map(_draw, itertools.repeat(name), seeds, itertools.repeat(args.answer_cap))
                for t in part
            ]
            cells = []
            for i, key in enumerate(("ttft", "last", "wait")):
                values = [t[i] for t in times]
                cells.append(f"{key} {statistics.fmean(values):.4f}/{percentile(values, 0.9):.4f}")
            print(f"{name}: {', '.join(cells)} ({len(times)} requests, {len(seeds)} draws)", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
