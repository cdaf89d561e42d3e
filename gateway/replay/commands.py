"""``turnout trace agent|chat|mixed`` and ``turnout replay TRACE``: argument parsers and commands.

Heavy modules (servers, the gateway) are imported only when a command runs.
"""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

DEFAULT_PROFILES = ("cost",)


def positive_int(text: str) -> int:
    """An argparse type: a whole number >= 1 (argparse reports anything else as a usage error)."""
    value = int(text)
    if value < 1:
        raise argparse.ArgumentTypeError(f"must be at least 1, not {value}")
    return value


def non_negative(text: str) -> float:
    """An argparse type: a number >= 0."""
    value = float(text)
    if value < 0:
        raise argparse.ArgumentTypeError(f"must not be negative, not {text}")
    return value


def add_trace_parser(commands: Any) -> None:
    """``turnout trace KIND [--seed N] [--agents N] [--turns N] [--requests N] [--duration S] [--out F]``."""
    trace = commands.add_parser("trace", help="generate a synthetic request trace (turnout JSONL)")
    trace.add_argument("kind", choices=["agent", "chat", "mixed", "contention"])
    trace.add_argument("--seed", type=int, default=0)
    trace.add_argument("--model", default="replay", help="model name written into every request")
    trace.add_argument(
        "--agents", type=positive_int, default=None, help="agent sessions (agent: 4, mixed: 2)"
    )
    trace.add_argument(
        "--turns", type=positive_int, default=None, help="turns per agent (agent: 24, mixed: 16)"
    )
    trace.add_argument("--requests", type=int, default=None, help="chat requests (chat: 200, mixed: 150)")
    trace.add_argument("--duration", type=float, default=60.0, help="seconds the chat requests span")
    trace.add_argument("--max-context", type=int, default=60000, help="tokens an agent conversation grows to")
    trace.add_argument(
        "--system-tokens", type=positive_int, default=6000, help="contention: shared system prompt"
    )
    trace.add_argument(
        "--oneshot-every",
        type=non_negative,
        default=7.0,
        help="contention: mean seconds between one-shot requests",
    )
    trace.add_argument("--format", choices=["turnout", "mooncake"], default="turnout", help="output format")
    trace.add_argument("--out", type=Path, default=None, help="write here instead of stdout")
    trace.set_defaults(func=cmd_trace)


def positive(text: str) -> float:
    """An argparse type: a number > 0."""
    value = float(text)
    if not value > 0:
        raise argparse.ArgumentTypeError(f"must be positive, not {text}")
    return value


def add_replay_parser(commands: Any) -> None:
    """``turnout replay TRACE --profile P [--profile P2 ...] [options]``."""
    replay = commands.add_parser(
        "replay", help="replay a trace through the gateway over simulated engines, per profile + oracle"
    )
    replay.add_argument("trace", type=Path)
    replay.add_argument("--format", choices=["turnout", "mooncake"], default="turnout")
    replay.add_argument(
        "--clock",
        choices=["virtual", "wall"],
        default="virtual",
        help="virtual: the router and the engine models on simulated time (default); "
        "wall: real servers on the wall clock, compressed by --time-scale",
    )
    replay.add_argument("--model", default=None, help="served model name (default: the trace's first)")
    load = replay.add_mutually_exclusive_group()
    load.add_argument("--rate", type=positive, default=None, help="multiply the arrival rate by F")
    load.add_argument(
        "--load",
        type=positive,
        default=None,
        help="pick the rate so the prompts, without reuse, are L of the fleet's prefill capacity",
    )
    replay.add_argument(
        "--backends", type=Path, default=None, help="virtual: replay on the backends of this turnout config"
    )
    replay.add_argument(
        "--overhead-ms", type=non_negative, default=None, help="virtual: the gateway's own time per request"
    )
    replay.add_argument(
        "--time-scale", type=float, default=0.05, help="wall: wall seconds per simulated second"
    )
    replay.add_argument(
        "--profile", action="append", default=None, help="routing profile (repeatable; default: cost)"
    )
    replay.add_argument("--no-oracle", action="store_true", help="skip the hindsight oracle run")
    replay.add_argument(
        "--answer-cap",
        action="store_true",
        help="virtual only: send each answer's length as max_tokens (the router then knows it)",
    )
    replay.add_argument(
        "--schedules",
        type=int,
        default=0,
        help="virtual only: N sampled hindsight schedules too; the best (or the oracle's) is best-schedule",
    )
    replay.add_argument(
        "--lookahead",
        action="store_true",
        help="virtual only: the look-ahead oracle too (best candidates played to the end: slow)",
    )
    replay.add_argument("--json", type=Path, default=None, help="write the JSON report here")
    replay.add_argument("--limit", type=int, default=None, help="replay only the first N requests")
    replay.add_argument(
        "--last-minutes",
        type=positive,
        default=None,
        help="replay only the requests of the trace's last M minutes (a recording's latest traffic)",
    )
    replay.add_argument("--scale-tokens", type=float, default=1.0, help="multiply token lengths by F")
    replay.add_argument(
        "--wall-cap", type=float, default=600.0, help="wall: wall seconds per profile, at most"
    )
    replay.add_argument(
        "--llama-slots", type=positive_int, default=2, help="slots of the simulated llama.cpp (-np)"
    )
    replay.set_defaults(func=cmd_replay)


def cmd_trace(args: argparse.Namespace) -> int:
    """Generate the trace and write it as JSONL."""
    from gateway.replay.generate import agent_trace, chat_trace, contention_trace, mixed_trace
    from gateway.replay.traces import write_trace

    if args.kind == "agent":
        requests = agent_trace(
            agents=args.agents or 4,
            turns=args.turns or 24,
            seed=args.seed,
            model=args.model,
            max_context=args.max_context,
        )
    elif args.kind == "chat":
        requests = chat_trace(
            requests=args.requests or 200, duration=args.duration, seed=args.seed, model=args.model
        )
    elif args.kind == "contention":
        requests = contention_trace(
            agents=args.agents or 6,
            turns=args.turns or 12,
            seed=args.seed,
            model=args.model,
            system_tokens=args.system_tokens,
            oneshot_every=args.oneshot_every,
        )
    else:
        requests = mixed_trace(
            agents=args.agents or 2,
            turns=args.turns or 16,
            requests=args.requests or 150,
            duration=args.duration,
            seed=args.seed,
            model=args.model,
            max_context=args.max_context,
        )
    if args.out is None:
        write_trace(requests, sys.stdout, args.format)
    else:
        with args.out.open("w", encoding="utf-8") as handle:
            write_trace(requests, handle, args.format)
    return 0


def cmd_replay(args: argparse.Namespace) -> int:
    """Replay the trace per profile (+ oracle), print the table, write the JSON report."""
    from gateway.logging import configure_logging
    from gateway.replay.traces import (
        TraceError,
        last_minutes,
        one_model,
        read_trace,
        scale_tokens,
        with_model,
    )
    from policies import BUILTIN_PROFILES

    virtual_only = (
        args.backends is not None
        or args.overhead_ms is not None
        or args.schedules
        or args.lookahead
        or args.answer_cap
    )
    if args.clock == "wall" and virtual_only:
        return _usage(
            "--backends, --overhead-ms, --schedules, --lookahead and --answer-cap apply to --clock virtual "
            "only (the wall replay always sends max_tokens: the engines must stop there)"
        )
    if args.schedules < 0 or (args.schedules and args.no_oracle):
        return _usage("--schedules must be 0 or more, and needs the oracle (not --no-oracle)")
    if args.lookahead and args.no_oracle:
        return _usage("--lookahead needs the oracle (not --no-oracle)")
    profiles = args.profile or list(DEFAULT_PROFILES)
    known = list(BUILTIN_PROFILES)
    if args.backends is not None:  # and the profiles its config defines
        from gateway.replay.fleets import fleet_from_file
        from gateway.settings import ConfigError

        try:
            known += [p.name for p in fleet_from_file(args.backends, DEFAULT_PROFILES[0]).profiles]
        except ConfigError as exc:
            return _usage(str(exc))
    unknown = [p for p in profiles if p not in known]
    if unknown:
        return _usage(f"unknown profile {unknown[0]!r}; known: {', '.join(known)}")
    try:
        requests = read_trace(args.trace, args.format, limit=args.limit)
    except (OSError, TraceError) as exc:
        return _usage(f"{args.trace}: {exc}")
    if args.last_minutes is not None:
        requests = last_minutes(requests, args.last_minutes)
    if not requests:
        return _usage("the trace is empty")
    models = {r.model for r in requests}
    try:
        requests, chosen = one_model(requests, args.model)
    except TraceError as exc:
        return _usage(f"{args.trace}: {exc}")
    if len(models) > 1:  # a recording of several models: this one's requests
        picked = "" if args.model is not None else " (the most requested model; --model picks another)"
        args.model = chosen
        where = (
            f"on {args.backends}"
            if args.backends is not None
            else "on the default fleet: the 27B's engines, vLLM and llama.cpp (docs/replay.md); "
            "--backends CONFIG replays on engines of your own"
        )
        print(f"turnout replay: the {len(requests)} requests to {chosen}{picked}, {where}", file=sys.stderr)
    elif args.model is not None and models != {args.model} and models != {"replay"}:
        (named,) = models
        print(f"turnout replay: the trace's requests name {named}; replayed as {args.model}", file=sys.stderr)
    configure_logging("json", "warning")
    requests = scale_tokens(requests, args.scale_tokens)
    if args.clock == "wall":
        return _replay_wall(args, with_model(requests, args.model or requests[0].model), profiles)
    return _replay_virtual(args, requests, profiles)


def _usage(message: str) -> int:
    print(f"turnout replay: {message}", file=sys.stderr)
    return 2


def _rate(args: argparse.Namespace, requests: Any, capacity: Callable[[], float]) -> float:
    """``--rate``, or the factor ``--load`` asks of the fleet's prefill ``capacity`` (tokens/s)."""
    from gateway.replay.traces import rate_for_load

    if args.load is None:
        return float(args.rate or 1.0)
    return rate_for_load(requests, args.load, capacity())


def _write(result: dict[str, Any], path: Path | None) -> None:
    from gateway.replay.report import table

    print(table(result["profiles"]))
    if path is not None:
        path.write_text(json.dumps(result, indent=2) + "\n", encoding="utf-8")


def _replay_virtual(args: argparse.Namespace, requests: Any, profiles: list[str]) -> int:
    from gateway.replay.fleets import capacity, default_fleet, fleet_from_file, sim_configs
    from gateway.replay.report import report
    from gateway.replay.simulate import simulate
    from gateway.replay.traces import block_tokens, with_model, with_rate
    from gateway.replay.virtual_world import OVERHEAD_S, VirtualOptions
    from gateway.settings import ConfigError

    def settings_for(profile: str) -> Any:
        if args.backends is not None:
            return fleet_from_file(args.backends, profile)
        return default_fleet(model, profile, args.llama_slots)

    try:
        if args.backends is not None:
            first = fleet_from_file(args.backends, profiles[0])
            model = args.model or first.models[0].name
        else:
            model = args.model or requests[0].model
            first = settings_for(profiles[0])
        configs = sim_configs(first, model)
    except ConfigError as exc:
        return _usage(str(exc))
    requests = with_model(requests, model)
    factor = _rate(args, requests, lambda: capacity(first, model, configs))
    requests = with_rate(requests, factor)
    overhead = OVERHEAD_S if args.overhead_ms is None else args.overhead_ms / 1000
    options = VirtualOptions(
        overhead_s=overhead, block_tokens=block_tokens(args.scale_tokens), answer_cap=args.answer_cap
    )

    def done(name: str, world: Any) -> None:
        speedup = world.simulated_s / world.wall_s if world.wall_s > 0 else 0.0
        print(
            f"turnout replay: {name} done: {world.simulated_s:.1f} simulated s in {world.wall_s:.2f} wall s"
            f" ({speedup:.0f}x)",
            file=sys.stderr,
        )

    runs = simulate(
        requests,
        profiles,
        settings_for,
        model,
        options,
        oracle=not args.no_oracle,
        schedules=args.schedules,
        lookahead=args.lookahead,
        on_done=done,
    )
    meta = {
        "trace": str(args.trace),
        "format": args.format,
        "requests": len(requests),
        "clock": "virtual",
        "model": model,
        "backends": str(args.backends) if args.backends is not None else None,
        "llama_slots": args.llama_slots if args.backends is None else None,
        "scale_tokens": args.scale_tokens,
        "rate": round(factor, 6),
        "load": args.load,
        "overhead_s": overhead,
        "simulated_s": {name: round(s, 3) for name, s in runs.simulated_s.items()},
    }
    print(f"turnout replay: speed-up {runs.speedup:.0f}x (simulated / wall seconds)", file=sys.stderr)
    block = block_tokens(args.scale_tokens)
    _write(report(runs.runs, meta, requests, block, runs.bounds), args.json)
    return 0


def _replay_wall(args: argparse.Namespace, requests: Any, profiles: list[str]) -> int:
    from gateway.replay.report import report
    from gateway.replay.runner import ReplayOptions, run_replay
    from gateway.replay.traces import block_tokens, with_rate
    from gateway.replay.workstation import StackOptions

    model = requests[0].model
    stack = StackOptions(model=model, time_scale=args.time_scale, llama_slots=args.llama_slots)
    factor = _rate(args, requests, lambda: sum(c.prefill_tok_s for c in stack.sim_configs().values()))
    requests = with_rate(requests, factor)
    block = block_tokens(args.scale_tokens)
    options = ReplayOptions(time_scale=args.time_scale, block_tokens=block, wall_cap_s=args.wall_cap)
    runs = run_replay(
        requests,
        profiles,
        stack,
        options,
        oracle=not args.no_oracle,
        on_done=lambda name, _: print(f"turnout replay: {name} done", file=sys.stderr),
    )
    meta = {
        "trace": str(args.trace),
        "format": args.format,
        "requests": len(requests),
        "clock": "wall",
        "time_scale": args.time_scale,
        "scale_tokens": args.scale_tokens,
        "rate": round(factor, 6),
        "load": args.load,
    }
    _write(report(runs, meta, requests, block), args.json)
    return 0
