"""The routing benchmark in virtual time: every workload x the profiles + the hindsight oracle + the
lower bound, on the engine models (``turnout replay --clock virtual``).

    .venv/bin/python bench/routing.py [--quick] [--only NAME ...] [--out docs/benchmarks.md]
                                      [--json F] [--from-json F] [--jobs N] [--draws A-B]
    .venv/bin/python bench/routing.py --validation [--cost-only] [--jobs N] [--json F]

Everything runs in simulated time (``gateway/replay/virtual.py``): the numbers depend on the router
and the engine models only, never on the machine, so one run is the answer (no medians). Token
lengths are the traces' own. Workloads (deterministic; the generated ones over ``SEEDS`` draws):

* ``agent``: 2 agents (= the llama.cpp slots), 30 turns each, 4k -> 60k tokens.
* ``chat``: 100 independent requests over 60 s.
* ``mixed``: 2 agents x 16 turns (4k -> 60k) + 80 chat requests over 60 s.
* ``mooncake``: the whole Mooncake conversation trace (12,031 requests, full lengths), its arrival
  rate set so its prompts, without reuse, are 70% of the fleet's prefill capacity (``--load 0.7``).
* ``contention-N`` (N = 1, 2, 4, 8 agents on the 2 llama.cpp slots): N agents x 12 turns over a shared
  6k-token system prompt, +1.2k-3.8k tokens a turn, answers 80-400 tokens, plus one-shot requests of
  1.5k-9k tokens every ~7 s; with ``x-session-id``, and again as ``contention-N-nosession`` without.
* ``fleet-16``: 32 agents x 12 turns and one-shots every ~1 s on ``bench/fleets/sixteen.toml``
  (4 vLLM + 12 llama-servers of 2 slots).
* the homogeneous rows, where the published routers are at home: ``chat-8vllm``, ``mixed-8vllm`` and
  ``mooncake-8vllm`` on ``bench/fleets/eight-vllm.toml`` (8 vLLM replicas of a dense model, prefix
  caching on; chat and mixed at 8x their load), ``contention-16-8llama`` and ``contention-32-8llama``
  on ``bench/fleets/eight-llama.toml`` (8 llama-servers of 2 slots).

Every row replays ``cost``, the strawmen (least-loaded, round-robin, one engine alone), the published
routers (``policies.peers``), the hindsight oracle and ``best-schedule`` (the best of it and 8 sampled
hindsight schedules), and the lower bound. A full run takes over an hour on 2 cores (the homogeneous
rows most of it); ``--json`` is written after every row.

The fleet, except for fleet-16 and the homogeneous rows: a vLLM engine (hybrid, vLLM 0.25's prefix
cache in 1,568-token blocks, 94k window) and a llama.cpp engine (hybrid, 2 slots of 64k, RAM prompt
cache at 8 GiB), DOMAIN.md rates, probes every 2 s, the gateway's own time 1.6 ms a request. It
prints each target as met or missed, with the reason.

A generated workload (chat, mixed, contention-N) is ``SEEDS`` draws of its generator (seeds 0 to
``SEEDS - 1``; contention-A's draw N is ``turnout trace contention --agents A --seed A+100N``), each
replayed with every profile, the oracle and the lower bound, and its row pools them
(``pooled_report``: every request of every draw counts once): near saturation one decision that goes
the other way changes every queue after it, and one draw moves by tens of percent with any change to
the cost model, in either direction (notes). The targets are judged on the pooled row; each draw's own
``cost`` / oracle ratio is printed under it. ``--quick`` runs one smaller draw. The draws run in
``--jobs`` processes; the report does not depend on how many. ``--draws 32-127`` replays other draws
than the benchmark's (an out-of-sample check: the rules were tuned looking at draws 0-31); the per-draw
lines name the draws by their own numbers.

``--validation`` replays the validation set instead (``routing_validation.py``, docs/validation.md);
``--validation --cost-only`` replays ``cost`` alone there and prints each row's pooled mean and p90:
what a routing change's commit quotes, before and after (docs/replay.md).
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
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

from routing_peers import judged_on, with_best_peer
from routing_report import markdown, targets
from routing_validation import DRAWS, VALIDATION, validation_markdown, validation_targets
from routing_workloads import MODEL, MOONCAKE, PEERS, REPO, SCHEDULES, SEEDS, WORKLOADS, Workload

from gateway.logging import configure_logging
from gateway.replay.fleets import capacity, default_fleet, fleet_from_file, sim_configs
from gateway.replay.report import Draw, awaited_s, percentile, pooled_report, report, table
from gateway.replay.results import ORACLE, Result
from gateway.replay.simulate import simulate
from gateway.replay.traces import TraceRequest, rate_for_load, with_model, with_rate
from gateway.replay.virtual_world import VirtualOptions, World
from gateway.settings import Settings

OTHERS = "<!-- other benchmarks: kept when this file is regenerated -->"


def workload_settings(workload: Workload) -> Callable[[str], Settings]:
    def settings_for(profile: str) -> Settings:
        if workload.fleet is not None:
            return fleet_from_file(workload.fleet, profile)
        return default_fleet(MODEL, profile)

    return settings_for


def _progress(workload: str) -> Callable[[str, World], None]:
    def done(name: str, world: World) -> None:
        print(
            f"  {workload}/{name}: {world.simulated_s:.0f} simulated s in {world.wall_s:.1f} wall s",
            file=sys.stderr,
        )

    return done


def run(workload: Workload, quick: bool, jobs: int = 1, draws: range = range(SEEDS)) -> dict[str, Any]:
    """One row: the workload's replay with every profile, the oracle and the lower bound; for a
    generated workload (not ``quick``), its ``draws`` pooled (``pooled_report``), with each draw's
    ``cost`` / oracle ratio in ``seeds`` and / its best peer's in ``peer_seeds``."""
    if workload.seeded is not None and not quick:
        return _pooled(workload, jobs, draws)
    requests = with_model(workload.make(quick), MODEL)
    settings_for = workload_settings(workload)
    rate = 1.0
    if workload.load is not None:
        configs = sim_configs(settings_for("cost"), MODEL)
        rate = rate_for_load(requests, workload.load, capacity(settings_for("cost"), MODEL, configs))
        requests = with_rate(requests, rate)
    started = time.monotonic()
    runs = simulate(
        requests,
        workload.profiles,
        settings_for,
        MODEL,
        VirtualOptions(),
        schedules=SCHEDULES,
        on_done=_progress(workload.name),
    )
    meta = {
        "workload": workload.name,
        "scaling": workload.scaling,
        "homogeneous": workload.homogeneous,
        "requests": len(requests),
        "rate": round(rate, 6),
        "agent_share": agent_share(requests),
        "simulated_s": round(max(runs.simulated_s.values()), 1),
        "wall_s": round(time.monotonic() - started, 1),
        "speedup": round(runs.speedup),
    }
    return report(runs.runs, meta, requests, bounds=runs.bounds)


def agent_share(requests: Sequence[TraceRequest]) -> float:
    """The share of a row's requests that are agents' calls (``TraceRequest.agent``): from half of
    them the row is judged on the time to the last token (``routing_peers.peer_targets``)."""
    return round(sum(r.agent for r in requests) / len(requests), 4) if requests else 0.0


def _draw_of(name: str, seed: int) -> tuple[Draw, dict[str, float], dict[str, float]]:
    """Draw ``seed`` of the workload ``name`` replayed with its profiles (a worker's task): the
    draw, and each run's simulated and wall seconds."""
    workload = next(w for w in (*WORKLOADS, *VALIDATION) if w.name == name)
    assert workload.seeded is not None
    requests = with_model(workload.seeded(seed), MODEL)
    runs = simulate(
        requests, workload.profiles, workload_settings(workload), MODEL, VirtualOptions(), schedules=SCHEDULES
    )
    return Draw(runs.runs, requests, runs.bounds), runs.simulated_s, runs.wall_s


def _pooled(workload: Workload, jobs: int, seeds: range) -> dict[str, Any]:
    started = time.monotonic()
    with concurrent.futures.ProcessPoolExecutor(
        max_workers=jobs, initializer=configure_logging, initargs=("json", "warning")
    ) as pool:
        done = list(pool.map(_draw_of, itertools.repeat(workload.name), seeds))
    draws = [draw for draw, _, _ in done]
    share = agent_share([r for d in draws for r in d.trace])
    simulated = sum(sum(s.values()) for _, s, _ in done)
    wall = sum(sum(w.values()) for _, _, w in done)
    meta = {
        "workload": workload.name,
        "scaling": workload.scaling,
        "homogeneous": workload.homogeneous,
        "draws": len(seeds),
        "first_draw": seeds.start,
        "requests": sum(len(d.trace) for d in draws),
        "rate": 1.0,
        "agent_share": share,
        "simulated_s": round(sum(max(s.values()) for _, s, _ in done), 1),
        "wall_s": round(time.monotonic() - started, 1),
        "speedup": round(simulated / wall) if wall > 0 else 0,
    }
    print(f"  {workload.name}: {len(seeds)} draws in {meta['wall_s']} wall s", file=sys.stderr)
    out = pooled_report(draws, meta)
    out["seeds"] = [round(_mean_ttft(d.runs["cost"]) / _mean_ttft(d.runs[ORACLE]), 4) for d in draws]
    peers = [p for p in workload.profiles if p in PEERS]
    if peers:  # cost / the draw's best peer, on the mean the row is judged on (routing_peers.judged_on)
        on = judged_on(share)[2]
        out["peer_seeds"] = [
            round(_mean_awaited(d, "cost") / min(_mean_awaited(d, p) for p in peers), 4) for d in draws
        ]
        out["peer_seeds_on"] = on
    return out


def _mean_ttft(results: Sequence[Result]) -> float:
    return statistics.mean(r.ttft_s for r in results if r.ok and r.ttft_s is not None)


def _mean_awaited(draw: Draw, profile: str) -> float:
    """The mean wait of ``profile``'s requests in ``draw``: agents' calls by their last token, the
    rest by their first (``awaited_s``)."""
    agents = [r.agent for r in draw.trace]
    return statistics.mean(awaited_s(r, agents) for r in draw.runs[profile] if r.ok)


def positive_int(text: str) -> int:
    value = int(text)
    if value < 1:
        raise argparse.ArgumentTypeError(f"must be at least 1, not {value}")
    return value


def draw_range(text: str) -> range:
    """``A-B`` (both included) or ``N`` (draws 0 to N-1)."""
    first, dash, last = text.partition("-")
    try:
        seeds = range(int(first), int(last) + 1) if dash else range(int(first))
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected A-B or a count, not {text!r}") from None
    if not seeds:
        raise argparse.ArgumentTypeError(f"no draws in {text!r}")
    return seeds


def other_draws(results: dict[str, dict[str, Any]]) -> list[str]:
    """The rows of ``results`` pooled over other draws than the benchmark's (0 to ``SEEDS - 1``)."""
    return [
        name
        for name, result in results.items()
        if result["meta"].get("draws")
        and (result["meta"].get("first_draw", 0), result["meta"]["draws"]) != (0, SEEDS)
    ]


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--quick", action="store_true", help="smaller workloads (a smoke run)")
    parser.add_argument(
        "--validation",
        action="store_true",
        help=f"the validation set instead (bench/routing_validation.py, {DRAWS} draws; default --out "
        "docs/validation.md)",
    )
    parser.add_argument(
        "--cost-only",
        action="store_true",
        help="with --validation: cost alone (no peers, no oracle), each row's pooled mean and p90 TTFT, "
        "printed: the numbers a routing change's commit quotes, before and after",
    )
    parser.add_argument(
        "--profile",
        default="cost",
        help="with --cost-only: the profile replayed (default cost; cost-ttft: cost before issue #61)",
    )
    parser.add_argument("--only", action="append", choices=[w.name for w in WORKLOADS], default=None)
    parser.add_argument("--out", type=Path, default=None, help="default: docs/benchmarks.md")
    parser.add_argument("--json", type=Path, default=None)
    parser.add_argument(
        "--jobs",
        type=positive_int,
        default=os.cpu_count() or 1,
        help="processes replaying draws at once (default: the cores)",
    )
    parser.add_argument(
        "--from-json",
        type=Path,
        default=None,
        help="start from a saved --json: re-render it, re-running only the --only workloads",
    )
    parser.add_argument(
        "--draws",
        type=draw_range,
        default=range(SEEDS),
        help=f"the generated rows' draws: A-B or a count (default 0-{SEEDS - 1}; e.g. 32-127 out of sample)",
    )
    args = parser.parse_args(argv)
    if args.validation:
        if args.only or args.from_json is not None:
            parser.error("--validation replays every validation row: it takes no --only or --from-json")
        return check(args) if args.cost_only else validate(args)
    if args.cost_only:
        parser.error("--cost-only judges a routing change on the validation set: it needs --validation")
    other = args.draws != range(SEEDS)
    if other and args.quick:
        parser.error("--quick replays one smaller draw: it takes no --draws")
    if other and args.from_json is not None and not args.only:
        parser.error("--draws with --from-json replays only the --only rows: name them")
    results: dict[str, dict[str, Any]] = {}
    if args.from_json is not None:
        results = json.loads(args.from_json.read_text(encoding="utf-8"))
    if args.out is None:
        if other or other_draws(results):
            parser.error(
                f"rows over draws other than 0-{SEEDS - 1} need --out: docs/benchmarks.md holds the "
                "benchmark's own"
            )
        args.out = REPO / "docs" / "benchmarks.md"
    configure_logging("json", "warning")
    for workload in WORKLOADS if args.from_json is None or args.only else ():
        if args.only and workload.name not in args.only:
            continue
        if workload.name == "mooncake" and not MOONCAKE.exists():
            print(f"skipping mooncake: {MOONCAKE} not found", file=sys.stderr)
            continue
        print(f"{workload.name}: {workload.scaling}", file=sys.stderr)
        results[workload.name] = run(workload, args.quick, args.jobs, args.draws)
        print(table(with_best_peer(results[workload.name]["profiles"])))
        if args.json is not None:  # row by row: a run cut short keeps its rows (--from-json renders them)
            args.json.write_text(json.dumps(results, indent=2) + "\n", encoding="utf-8")
    text = markdown(results, args.quick)
    print("\n".join(targets(results, args.quick)))
    if args.json is not None:
        args.json.write_text(json.dumps(results, indent=2) + "\n", encoding="utf-8")
    kept = args.out.read_text(encoding="utf-8").partition(OTHERS)[2] if args.out.exists() else ""
    args.out.write_text(text + ("\n" + OTHERS + kept if kept else ""), encoding="utf-8")
    return 0


def _cost_draw(name: str, seed: int, profile: str = "cost") -> list[tuple[float, float, float]]:
    """The TTFTs, times to the last token and waits (``awaited_s``) ``profile`` gives draw ``seed``
    of the validation row ``name`` (a worker's task)."""
    workload = next(w for w in VALIDATION if w.name == name)
    assert workload.seeded is not None
    requests = with_model(workload.seeded(seed), MODEL)
    runs = simulate(requests, [profile], workload_settings(workload), MODEL, VirtualOptions(), oracle=False)
    agents = [r.agent for r in requests]
    return [
        (r.ttft_s, r.completion_s, awaited_s(r, agents))
        for r in runs.runs[profile]
        if r.ok and r.ttft_s is not None
    ]


def check(args: argparse.Namespace) -> int:
    """``--validation --cost-only``: every validation row replayed with ``cost`` alone, its draws pooled
    (each request once): mean and p90 TTFT, printed and, with ``--json``, written."""
    draws = range(DRAWS) if args.draws == range(SEEDS) else args.draws
    configure_logging("json", "warning")
    out: dict[str, dict[str, float]] = {}
    with concurrent.futures.ProcessPoolExecutor(
        max_workers=args.jobs, initializer=configure_logging, initargs=("json", "warning")
    ) as pool:
        for workload in VALIDATION:
            own = range(workload.draws) if workload.draws is not None else draws
            parts = pool.map(_cost_draw, itertools.repeat(workload.name), own, itertools.repeat(args.profile))
            times = [t for part in parts for t in part]
            row: dict[str, float] = {}
            for i, key in enumerate(("ttft", "completion", "awaited")):
                values = [t[i] for t in times]
                row[f"{key}_mean_s"] = round(statistics.fmean(values), 4)
                row[f"{key}_p90_s"] = round(percentile(values, 0.9) or 0.0, 4)
            out[workload.name] = row
            print(
                f"{workload.name}: {args.profile} mean {row['ttft_mean_s']:.4f} s, "
                f"p90 {row['ttft_p90_s']:.4f} s; "
                f"last token mean {row['completion_mean_s']:.4f} s, p90 {row['completion_p90_s']:.4f} s; "
                f"wait mean {row['awaited_mean_s']:.4f} s, p90 {row['awaited_p90_s']:.4f} s "
                f"({len(times)} requests, {len(own)} draws)"
            )
    if args.json is not None:
        args.json.write_text(json.dumps(out, indent=2) + "\n", encoding="utf-8")
    return 0


def validate(args: argparse.Namespace) -> int:
    """``--validation``: every row of the validation set, its tables and targets (module docstring)."""
    draws = range(DRAWS) if args.draws == range(SEEDS) else args.draws
    configure_logging("json", "warning")
    results: dict[str, dict[str, Any]] = {}
    for workload in VALIDATION:
        print(f"{workload.name}: {workload.scaling}", file=sys.stderr)
        own = range(workload.draws) if workload.draws is not None else draws
        results[workload.name] = run(workload, args.quick, args.jobs, own)
        print(table(with_best_peer(results[workload.name]["profiles"])))
        if args.json is not None:
            args.json.write_text(json.dumps(results, indent=2) + "\n", encoding="utf-8")
    print("\n".join(validation_targets(results)))
    out = args.out or REPO / "docs" / "validation.md"
    out.write_text(validation_markdown(results), encoding="utf-8")
    return 0


if __name__ == "__main__":
    sys.exit(main())
