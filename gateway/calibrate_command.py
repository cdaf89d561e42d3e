"""``turnout calibrate URL --out PROFILE.toml``: measure a running engine, write its engine profile.

The measuring is ``backends.calibrate``; this module is the command line: options, the progress on
stderr, the summary, the file. Exit status 0 with a profile written, 2 when the engine cannot be
calibrated (unreachable, loading, busy, unknown), with the reason on stderr.
"""

from __future__ import annotations

import argparse
import asyncio
import random
import re
import sys
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import httpx

from backends.calibrate.engines import CalibrationError, connect
from backends.calibrate.procedure import calibrate
from backends.calibrate.run import Options
from backends.clock import WALL
from backends.engine_profiles import builtin_names, save_profile
from policies.engine_profile import EngineProfile, relative_errors

_DURATION = re.compile(r"^(\d+(?:\.\d+)?)\s*([smh]?)$")


def parse_duration(text: str) -> float:
    """``90``, ``90s``, ``10m``, ``1.5h`` -> seconds."""
    match = _DURATION.match(text.strip())
    if not match:
        raise argparse.ArgumentTypeError(f"not a duration: {text!r} (say 600, 600s, 10m or 1h)")
    return float(match.group(1)) * {"": 1, "s": 1, "m": 60, "h": 3600}[match.group(2)]


def _pair(text: str) -> tuple[str, str]:
    key, sep, value = text.partition("=")
    if not sep or not key:
        raise argparse.ArgumentTypeError(f"expected KEY=TEXT, not {text!r}")
    return key.strip(), value.strip()


def add_calibrate_parser(commands: Any) -> None:
    parser = commands.add_parser(
        "calibrate",
        help="measure a running llama-server or vLLM and write its engine profile (docs/calibrate.md)",
        description="Measure one idle engine through its own API (llama-server or vLLM, detected) and write "
        "an engine profile: prefill by prompt and cached tokens, decode by batch and context, and the "
        "restores (llama.cpp: warm turn, checkpoint, RAM cache; vLLM: prefix-cache blocks).",
    )
    parser.add_argument("url", nargs="?", help="the engine's base URL, e.g. http://127.0.0.1:8080")
    parser.add_argument("--out", type=Path, help="where to write the profile (TOML)")
    parser.add_argument("--name", help="the profile's name (default: the file's stem)")
    parser.add_argument("--budget", type=parse_duration, default=600.0, help="time to spend (default 10m)")
    parser.add_argument(
        "--ubatch", type=int, help="the engine's micro-batch (llama --ubatch-size; default 512)"
    )
    parser.add_argument(
        "--batch",
        type=int,
        help="tokens per engine step (llama --batch-size, vLLM --max-num-batched-tokens; 2048)",
    )
    parser.add_argument(
        "--window", type=int, help="measure prompts up to this many tokens (default: the engine's)"
    )
    parser.add_argument(
        "--no-checkpoints", action="store_true", help="llama.cpp serving a dense model: no checkpoint cuts"
    )
    parser.add_argument(
        "--machine", type=_pair, action="append", default=[], metavar="KEY=TEXT",
        help="describe the machine in the profile (gpu=..., flags=...; repeatable)",
    )  # fmt: skip
    parser.add_argument("--api-key", help="sent as Authorization: Bearer")
    parser.add_argument(
        "--seed", type=int, help="seeds the prompts' tokens (default: a fresh one, so that no prompt of an"
        " earlier run is still in the engine's caches)",
    )  # fmt: skip
    parser.add_argument(
        "--repeat", type=int, default=2, help="measure each cheap point N times, keep the fastest (default 2)"
    )
    parser.add_argument("--list", action="store_true", help="list the built-in profiles and exit")
    parser.set_defaults(func=cmd_calibrate)


def cmd_calibrate(args: argparse.Namespace) -> int:
    if args.list:
        print("\n".join(builtin_names()))
        return 0
    if not args.url or args.out is None:
        print("turnout calibrate: give the engine's URL and --out PROFILE.toml", file=sys.stderr)
        return 2
    try:
        profile = asyncio.run(_run(args))
    except CalibrationError as exc:
        print(f"turnout calibrate: {exc}", file=sys.stderr)
        return 2
    header = [f"Written by turnout calibrate {args.url} on {datetime.now(UTC):%Y-%m-%d %H:%M} UTC."]
    save_profile(profile, args.out, header=header)
    print(summary(profile))
    print(f"wrote {args.out}")
    return 0


async def _run(args: argparse.Namespace) -> EngineProfile:
    headers = {"Authorization": f"Bearer {args.api_key}"} if args.api_key else {}
    timeout = httpx.Timeout(max(args.budget, 60.0) * 2, connect=10.0)
    async with httpx.AsyncClient(base_url=args.url.rstrip("/"), headers=headers, timeout=timeout) as client:
        seed = args.seed if args.seed is not None else random.SystemRandom().randrange(2**31)
        engine = await connect(client, seed=seed)
        info = engine.info
        print(
            f"calibrating {info.engine} at {args.url}: {info.model}, window {info.window:,},"
            f" {info.slots} slot(s); budget {args.budget:.0f} s",
            file=sys.stderr,
        )
        options = Options(
            name=args.name or args.out.stem,
            budget_s=args.budget,
            ubatch=args.ubatch,
            batch=args.batch,
            checkpoint_splits=not args.no_checkpoints,
            window=args.window,
            machine=tuple(args.machine),
            source=f"turnout calibrate {args.url} --budget {args.budget:.0f}s --seed {seed}"
            f" ({datetime.now(UTC):%Y-%m-%d})",
            seed=seed,
            repeat=max(1, args.repeat),
        )
        return await calibrate(
            engine,
            options,
            clock=WALL.monotonic,
            progress=lambda line: print(line, file=sys.stderr, flush=True),
        )


def summary(profile: EngineProfile) -> str:
    """What a person reads after a calibration: the fitted numbers, the fit's error, the checks."""
    p, d = profile.prefill, profile.decode
    errors = sorted(abs(e) for e in relative_errors(profile))
    lines = [
        f"{profile.name}: {profile.engine}, {profile.model}",
        f"  prefill  {p.request_s * 1000:.1f} ms a request"
        f" + {1 / p.token_s if p.token_s else float('inf'):,.0f} tok/s + {p.batch_s:.3f} s per batch"
        f" of >= {p.batch_min} (ubatch {p.ubatch}, batch {p.batch}), attention {p.context_s:.2e} s/token/1k",
        f"           cold 4k: {profile.prefill_seconds(4096):.2f} s ({profile.prefill_tok_s():,.0f} tok/s)",
        f"  decode   {1 / d.step_s:,.1f} tok/s, +{d.seq_s * 1000:.2f} ms per sequence,"
        f" +{d.context_s * 1000:.3f} ms per 1k context",
        f"  fit      median error {errors[len(errors) // 2]:.0%}, worst {errors[-1]:.0%}"
        f" over {len(errors)} points"
        if errors
        else "  fit      no points",
    ]
    for check in profile.checks:
        lines.append(
            f"  {check.name:<10} {check.prompt:,} tokens, {check.cached:,} reused: {check.seconds:.3f} s"
            f" (cold {check.cold_seconds:.3f} s, profile predicts {check.predicted_s:.3f} s)"
        )
    if profile.cache.ram_restore_token_s:
        lines.append(f"  ram      restore {profile.cache.ram_restore_token_s * 1e6:.1f} us a token")
    cache = profile.cache
    if profile.engine == "llamacpp":  # 0 when not timed (a note says why) or too small to see
        lines.append(
            f"  ram      save {cache.ram_save_s * 1000:.1f} ms"
            f" + {cache.ram_save_token_s * 1e6:.2f} us a token"
            f" + {cache.ram_save_checkpoint_s * 1000:.1f} ms a checkpoint held"
            " (taken out of the prefill points)"
        )
        lines.append(
            f"  checkpoint  taken {p.checkpoint_s * 1000:.1f} ms each (taken out of the prefill points),"
            f" restored {cache.checkpoint_restore_s * 1000:.1f} ms"
        )
    lines.extend(f"  note     {note}" for note in profile.notes)
    return "\n".join(lines)
