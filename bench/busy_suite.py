"""The whole suite on a busy machine: a fresh clone, a CPU hog on every core, ``make test`` N times.

    python bench/busy_suite.py                 # 3 runs of the committed HEAD, one hog per core
    python bench/busy_suite.py --runs 1 --hogs 4 --ref main

A shared developer box or a CI runner often has another job on its cores; the suite must stay green
there (issue #25). Each run clones the repository's committed ``--ref`` afresh into a temporary
directory (no ``.venv``, no caches of the work tree; the engines' build cache in ``~/.cache/turnout``
is shared, as on any developer's machine) and runs ``make test`` there with ``CI=true``, as ``.ci/run``
does, while the hogs (``stress-ng --cpu N`` when installed, else a busy-looping process per core, at the
suite's own priority) keep every core busy. It prints each run's verdict, pytest's closing line and its
duration, then a summary; it exits 0 only if every run passed. Bounded: each run is killed after
``--run-timeout`` seconds, and the hogs stop with the script.
"""

from __future__ import annotations

import argparse
import multiprocessing
import os
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
SUMMARY = re.compile(r"^=+ (.*\d+ (passed|failed).*) in [\d.]+s.*=+$", re.MULTILINE)


def _burn() -> None:  # pragma: no cover - runs in the hog processes
    os.setsid()
    while True:
        pass


class Hogs:
    """A CPU hog on each of ``count`` cores until ``stop()``."""

    def __init__(self, count: int) -> None:
        self.count = count
        self.processes: list[subprocess.Popen[bytes]] = []
        self.burners: list[multiprocessing.Process] = []
        self.kind = "stress-ng" if shutil.which("stress-ng") else "python busy loops"

    def start(self) -> Hogs:
        if self.kind == "stress-ng":
            self.processes.append(subprocess.Popen(
                ["stress-ng", "--cpu", str(self.count), "--cpu-method", "all", "--quiet"],
                stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, start_new_session=True,
            ))  # fmt: skip
        else:
            for _ in range(self.count):
                burner = multiprocessing.Process(target=_burn, daemon=True)
                burner.start()
                self.burners.append(burner)
        return self

    def stop(self) -> None:
        for process in self.processes:
            os.killpg(process.pid, signal.SIGTERM)
            process.wait(timeout=30)
        for burner in self.burners:
            burner.terminate()
            burner.join(timeout=30)


def clone(ref: str, into: Path) -> Path:
    target = into / "turnout"
    subprocess.run(["git", "clone", "--quiet", "--no-local", str(REPO), str(target)], check=True)
    subprocess.run(["git", "-C", str(target), "checkout", "--quiet", ref], check=True)
    return target


def run_once(index: int, ref: str, timeout: float, log_dir: Path) -> tuple[bool, str, float]:
    with tempfile.TemporaryDirectory(prefix=f"turnout-busy-{index}-") as tmp:
        tree = clone(ref, Path(tmp))
        log = log_dir / f"run-{index}.log"
        env = {**os.environ, "CI": "true"}  # noqa: TID251 (make test runs as .ci/run does)
        started = time.monotonic()
        with log.open("w") as out:
            make = subprocess.Popen(["make", "test"], cwd=tree, env=env, stdout=out, stderr=subprocess.STDOUT,
                                    start_new_session=True)  # fmt: skip
            try:
                code = make.wait(timeout=timeout)
            except subprocess.TimeoutExpired:
                os.killpg(make.pid, signal.SIGKILL)
                make.wait()
                code = -1
        took = time.monotonic() - started
        text = log.read_text(errors="replace")
        found = SUMMARY.findall(text)
        closing = (
            found[-1][0] if found else ("timed out" if code == -1 else f"no pytest summary (exit {code})")
        )
        return code == 0, closing, took


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    parser.add_argument("--runs", type=int, default=3)
    parser.add_argument(
        "--hogs", type=int, default=len(os.sched_getaffinity(0)), help="default: one per core"
    )
    parser.add_argument(
        "--ref", default="HEAD", help="the commit to clone (default: HEAD, committed work only)"
    )
    parser.add_argument(
        "--run-timeout", type=float, default=5400, help="seconds for one make test (CI's limit)"
    )
    parser.add_argument("--logs", type=Path, default=None, help="keep each run's output here")
    args = parser.parse_args(argv)

    ref = subprocess.run(["git", "-C", str(REPO), "rev-parse", "--short", args.ref], check=True,
                         capture_output=True, text=True).stdout.strip()  # fmt: skip
    log_dir = args.logs or Path(tempfile.mkdtemp(prefix="turnout-busy-logs-"))
    log_dir.mkdir(parents=True, exist_ok=True)
    hogs = Hogs(args.hogs).start()
    print(f"{args.runs} runs of make test at {ref}, fresh clones, {args.hogs} CPU hogs ({hogs.kind}); "
          f"logs in {log_dir}", flush=True)  # fmt: skip
    results = []
    try:
        for index in range(1, args.runs + 1):
            ok, closing, took = run_once(index, ref, args.run_timeout, log_dir)
            results.append(ok)
            print(f"run {index}: {'PASS' if ok else 'FAIL'}  {closing}  ({took / 60:.1f} min)", flush=True)
    finally:
        hogs.stop()
    print(f"{sum(results)} of {len(results)} runs green with every core busy")
    return 0 if all(results) else 1


if __name__ == "__main__":
    sys.exit(main())
