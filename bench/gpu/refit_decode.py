"""Refit a vLLM profile's decode without the points its calibration timed during the others' prefill.

    python bench/gpu/refit_decode.py backends/profiles/h100-vllm-27b-shape.toml \
        bench/gpu/results/2026-12-06c-h100-vllm/switch-compose.log

Until 2026-12-06 ``turnout calibrate`` timed a decode point of N sequences from each sequence's own
first token; vLLM prefills the other sequences' prompts in 2,048-token chunks between those steps, so
points of several sequences at 4k tokens each measured prefill (8 x 4k: 152.7 ms a step where 16
sequences decode at 23 ms) and the fit charged it to context (2.6 ms per 1k tokens). Calibrate now
times the stretch where all of them decode (``backends.calibrate.together``). For the profiles
measured before, this drops the points of more than one sequence whose prompts were longer than
``--max-prompt`` tokens, adds the decode rates ``bench/gpu/vllm_switch.py`` measured on the same
server (N streams of 256-token prompts, 256 tokens each; its log's ``decode xN`` lines), fits
``decode`` again, notes it in the file's comments and prints each point's error.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

import msgspec

REPO = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(REPO))

from refit import save_noted, shown  # noqa: E402  (beside this script)

from backends.engine_profiles import load_profile  # noqa: E402  (after the path is set)
from policies.engine_profile import Point  # noqa: E402
from policies.profile_fit import fit_decode  # noqa: E402

SWITCH_PROMPT = 256
"""Tokens of each decode stream's prompt in ``vllm_switch.py``."""


def switch_points(log: Path) -> list[Point]:
    """``decode xN`` lines of a ``vllm_switch.py`` log as points (batch, context in all, seconds)."""
    points = []
    for line in log.read_text(encoding="utf-8").splitlines():
        if not line.startswith("{"):
            continue
        entry = json.loads(line)
        if "streams" in entry and entry.get("per_stream_tok_s"):
            n, tokens = int(entry["streams"]), int(entry["tokens"])
            context = n * (SWITCH_PROMPT + tokens // 2)
            points.append(Point(n, context, round(1 / float(entry["per_stream_tok_s"]), 6)))
    return points


def main() -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("profile", type=Path)
    parser.add_argument("switch_log", type=Path)
    parser.add_argument("--max-prompt", type=int, default=1024, help="longest prompt a kept point of 2+ had")
    args = parser.parse_args()
    profile = load_profile(args.profile)
    if profile.engine != "vllm":
        raise SystemExit(f"{args.profile} is a {profile.engine} profile: this refit is vLLM's")
    kept = [p for p in profile.decode_points if p.a == 1 or p.b / p.a <= args.max_prompt + 64]
    dropped = [p for p in profile.decode_points if p not in kept]
    added = [p for p in switch_points(args.switch_log) if p not in kept]
    points = tuple(kept + added)
    refit = msgspec.structs.replace(profile, decode=fit_decode(points), decode_points=points)
    note = (
        f"Decode refit by bench/gpu/refit_decode.py: {len(dropped)} points timed during the others' "
        f"prefill dropped, {len(added)} from {shown(args.switch_log)} added."
    )
    save_noted(refit, args.profile, note)
    old, new = profile.decode, refit.decode
    print(f"decode was {old.step_s * 1000:.2f} ms + {old.seq_s * 1000:.3f} a sequence + "
          f"{old.context_s * 1000:.3f} per 1k; now {new.step_s * 1000:.2f} + {new.seq_s * 1000:.3f} + "
          f"{new.context_s * 1000:.3f}")  # fmt: skip
    for point in (*points, *dropped):
        predicted = refit.decode_step_seconds(point.a, point.b)
        error = (predicted - point.seconds) / point.seconds
        tag = "dropped" if point in dropped else "added" if point in added else "kept"
        print(
            f"{point.a:>3} x {point.b:>6} tokens: {point.seconds * 1000:7.2f} ms measured, "
            f"{predicted * 1000:7.2f} predicted ({error:+.0%}) {tag}"
        )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
