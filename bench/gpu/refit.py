"""Refit a profile's prefill with cold prefills measured later (``cold.py``), and rewrite it in place.

    python bench/gpu/refit.py backends/profiles/h200-llamacpp-flash-next-shape-mmap512.toml \
        bench/gpu/results/2026-12-03b-h200/cold.json --label compose
    python bench/gpu/refit.py backends/profiles/h100-vllm-27b-shape-fp8.toml   # its own points again
    python bench/gpu/refit.py PROFILE.toml --drop 16,0 --why "the server's first request"   # one left out

A vLLM profile with a prefix block is fitted with its steps cut to whole blocks, as vLLM 0.25's align
mode ran them (``policies.engine_profile``).

``turnout calibrate`` sizes its grid to its budget; prompts of 16k and 32k with 512-token micro-batches
(compose's flags then) take minutes each, so they were measured apart (``bench/gpu/run.sh cold:...``).
This adds the rows of ``cold.json`` whose label starts with ``--label`` to the profile's
``prefill_points``, fits the prefill
again over all of them (``policies.profile_fit``), raises ``context_window`` to the longest prompt now
measured, prices the scenarios (``[[checks]]``) again, keeps the file's leading comments and adds one
saying so, then prints each point's error.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

import msgspec

REPO = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(REPO))

from backends.engine_profiles import load_profile, save_profile  # noqa: E402  (after the path is set)
from policies.engine_profile import Check, EngineProfile, Point  # noqa: E402
from policies.profile_fit import fit_prefill  # noqa: E402


def shown(path: Path) -> Path:
    """``path`` as a profile's comment names it: from the repository's root where it is inside."""
    resolved = path.resolve()
    return resolved.relative_to(REPO) if resolved.is_relative_to(REPO) else resolved


def save_noted(profile: EngineProfile, path: Path, note: str) -> None:
    """Rewrite the profile at ``path``, keeping its leading comments and adding ``note`` (once)."""
    header = [
        line[2:] if line.startswith("# ") else line[1:]
        for line in path.read_text(encoding="utf-8").splitlines()
        if line.startswith("#")
    ]
    if note not in header:
        header.append(note)
    save_profile(profile, path, header=header)


def _recheck(before: EngineProfile, profile: EngineProfile, check: Check) -> Check:
    """The scenario's cold price and prediction by the refit profile: what calibrate priced beside
    the prefill (a RAM restore, the saves it waited for, a checkpoint restored) stays as it was
    (``backends.calibrate.procedure``)."""
    new, cached = check.prompt - check.cached, check.cached
    prefill = profile.prefill_seconds(new, cached)
    beside = check.predicted_s - before.prefill_seconds(new, cached)  # the saves, a checkpoint restored
    if check.name == "ram":  # its RAM restore as the refit profile prices it
        prefill += profile.ram_restore_seconds(cached)
        beside -= before.ram_restore_seconds(cached)
    return msgspec.structs.replace(
        check,
        cold_seconds=round(profile.prefill_seconds(check.prompt), 6),
        predicted_s=round(prefill + max(beside, 0.0), 6),
    )


def _ram_restore(before: EngineProfile, profile: EngineProfile) -> EngineProfile:
    """llama.cpp: the RAM restore a token measured again against the refit prefill, as calibrate
    measures it (what the ``ram`` scenario took beyond its prefill and the saves it waited for, per
    token it loaded back)."""
    ram = next((c for c in profile.checks if c.name == "ram" and c.cached > 0), None)
    if ram is None or profile.engine != "llamacpp":
        return profile
    new, cached = ram.prompt - ram.cached, ram.cached
    saves = ram.predicted_s - before.prefill_seconds(new, cached) - before.ram_restore_seconds(cached)
    token_s = max(ram.seconds - profile.prefill_seconds(new, cached) - max(saves, 0.0), 0.0) / cached
    cache = msgspec.structs.replace(profile.cache, ram_restore_token_s=round(token_s, 9))
    return msgspec.structs.replace(profile, cache=cache)


def main() -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("profile", type=Path)
    parser.add_argument("cold", type=Path, nargs="?", help="cold.json (none: refit the profile's own points)")
    parser.add_argument("--label", help="the rows of cold.json whose label starts so")
    parser.add_argument(
        "--drop", action="append", default=[], metavar="NEW,CACHED", help="leave this point out (repeatable)"
    )
    parser.add_argument("--why", default="", help="why the dropped points are left out (goes in the note)")
    args = parser.parse_args()
    dropped = {tuple(int(x) for x in d.split(",")) for d in args.drop}
    if dropped and not args.why:
        raise SystemExit("--drop needs --why: the profile's note says why a measured point was left out")
    profile = load_profile(args.profile)
    added: list[Point] = []
    if args.cold is not None:
        rows = [r for r in json.loads(args.cold.read_text()) if str(r["label"]).startswith(args.label or "")]
        if not rows:
            raise SystemExit(f"{args.cold}: no row labelled {args.label}...")
        added = [
            Point(int(r["prompt_n"]), int(r["cache_n"]), float(r["seconds"])) for r in rows
        ]  # new, cached
    points = tuple(p for p in profile.prefill_points if p not in added and (p.a, p.b) not in dropped)
    points += tuple(added)
    attention = any(p.b > 0 for p in points)
    align = profile.align_block  # vLLM's align mode cut the measured steps to whole blocks
    refit = msgspec.structs.replace(
        profile,
        prefill=fit_prefill(profile.prefill, points, attention=attention, align=align),
        prefill_points=points,
        context_window=max(profile.context_window, *(p.a + p.b for p in points)),
    )
    refit = _ram_restore(profile, refit)
    refit = msgspec.structs.replace(refit, checks=tuple(_recheck(profile, refit, c) for c in refit.checks))
    cut = f", its steps cut to whole {align}-token blocks (vLLM's align mode)" if align else ""
    source = f"{len(added)} cold prompts from {shown(args.cold)}" if args.cold else "its own points"
    left_out = "".join(f" without the point [{a}, {b}]" for a, b in sorted(dropped))
    why = f" ({args.why})" if dropped else ""
    save_noted(refit, args.profile, f"Prefill refit by bench/gpu/refit.py with {source}{left_out}{why}{cut}.")
    for point in points:
        predicted = refit.prefill_seconds(point.a, point.b)
        error = (predicted - point.seconds) / point.seconds
        print(
            f"{point.a:>7} new {point.b:>6} cached: {point.seconds:9.2f} s measured, "
            f"{predicted:9.2f} predicted ({error:+.0%})"
        )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
