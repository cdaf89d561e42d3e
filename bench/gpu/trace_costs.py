"""What llama-server's own trace says its slot bookkeeping cost (issue #63): each RAM-cache save by
the tokens and context checkpoints the slot held, fitted as ``fixed + per token + per checkpoint``,
and each context checkpoint taken while a prompt was processed.

Reads the logs ``bench/gpu/run.sh trace:LABEL`` copies (the server run with ``-lv 4 --log-timestamps``,
plain or gzipped):

- a **save** runs from ``saving prompt with length N`` to the next ``cache state`` line (saves that
  made room in the cache first, and repeats of a state already there, are left out); the
  checkpoints it held are in the cache's listing that follows;
- a **checkpoint taken** runs from ``cached n_tokens = P`` (a step about to start at P) to
  ``created context checkpoint ... n_tokens = P`` of the same task: the copy of the recurrent state,
  plus whatever the GPU still had to finish of the step before (a long step's tail: shown by the
  step's size).

    python bench/gpu/trace_costs.py bench/gpu/results/2026-12-07b-h100-q8-checkpoints/trace-*.log*
"""

from __future__ import annotations

import argparse
import gzip
import re
import statistics
from collections.abc import Iterator
from pathlib import Path

import numpy as np

SAVE = re.compile(r"saving prompt with length (\d+), total state size = ([\d.]+) MiB")
ENTRY = re.compile(r"(\d+) tokens, checkpoints:\s+(\d+),\s+([\d.]+) MiB")
STEP = re.compile(r"task (\d+) \| cached n_tokens = (\d+)")
TAKEN = re.compile(r"task (\d+) \| created context checkpoint .*n_tokens = (\d+)")
BUCKETS = ((0, 256), (257, 512), (513, 1024), (1025, 2048))


def stamp(line: str) -> float:
    """Seconds of a ``--log-timestamps`` stamp (``M.SS.mmm.uuu``)."""
    minutes, seconds, millis, micros = (int(x) for x in line.split()[0].split("."))
    return minutes * 60 + seconds + millis / 1e3 + micros / 1e6


def lines(path: Path) -> list[str]:
    opener = gzip.open if path.suffix == ".gz" else open
    with opener(path, "rt", errors="replace") as f:
        return f.read().splitlines()


def saves(log: list[str]) -> Iterator[tuple[int, int, float]]:
    """(tokens, checkpoints, seconds) of each save that made no room and was not a repeat."""
    for i, line in enumerate(log):
        found = SAVE.search(line)
        if not found:
            continue
        j, room = i + 1, False
        while j < min(len(log), i + 6) and "cache state" not in log[j]:
            room = room or "making room" in log[j]
            j += 1
        if j >= len(log) or "cache state" not in log[j] or room:
            continue
        seconds = stamp(log[j]) - stamp(line)
        held = None
        for entry in log[j + 1 :]:
            if "- prompt 0x" not in entry:
                break
            listed = ENTRY.search(entry)
            if listed and int(listed[1]) == int(found[1]):
                held = int(listed[2])
        if held is not None and seconds >= 0.01 and not (held >= 10 and seconds < 0.3):  # not a repeat
            yield int(found[1]), held, seconds


def takes(log: list[str]) -> Iterator[tuple[int, float]]:
    """(tokens of the step before, seconds) of each checkpoint taken where a step was to start."""
    last: dict[str, tuple[int, float]] = {}
    before: dict[str, int] = {}
    for line in log:
        if step := STEP.search(line):
            task, at = step[1], int(step[2])
            if task in last:
                before[task] = at - last[task][0]
            last[task] = (at, stamp(line))
        elif (taken := TAKEN.search(line)) and taken[1] in last and last[taken[1]][0] == int(taken[2]):
            yield before.get(taken[1], 0), stamp(line) - last[taken[1]][1]


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("logs", nargs="+", type=Path)
    args = parser.parse_args()
    logs = [lines(p) for p in args.logs]
    points = [s for log in logs for s in saves(log)]
    a = np.array([[1.0, n, k] for n, k, _ in points])
    y = np.array([s for *_, s in points])
    (fixed, per_token, per_checkpoint), *_ = np.linalg.lstsq(a, y, rcond=None)
    errors = np.abs(a @ [fixed, per_token, per_checkpoint] / y - 1)
    print(f"saves: {len(points)} (tokens, checkpoints held, seconds)")
    print(f"  fit  {fixed * 1e3:.1f} ms + {per_token * 1e6:.2f} us a token", end="")
    print(f" + {per_checkpoint * 1e3:.1f} ms a checkpoint")
    print(f"       median error {np.median(errors):.0%}, worst {errors.max():.0%}")
    taken = [t for log in logs for t in takes(log)]
    print("checkpoints taken, by the tokens of the step before (the GPU may still finish it: a tail)")
    for low, high in BUCKETS:
        times = [s for n, s in taken if low <= n <= high]
        if times:
            median, low_s, high_s = (x * 1e3 for x in (statistics.median(times), min(times), max(times)))
            print(f"  {low:>5,}-{high:<5,} tokens: {len(times):>3},", end="")
            print(f" median {median:.1f} ms, {low_s:.1f}-{high_s:.1f} ms")


if __name__ == "__main__":
    main()
