"""Are the numbers the demo's dashboard shows true? ``turnout demo`` for N minutes, then its TTFT figures.

    .venv/bin/python bench/demo_truth.py [--minutes 20] [--every 10]

Starts ``turnout demo`` as a user does (its own background traffic: two agents on the 27B and one-off
questions to Flash-Next, a third of them streamed) and, every ``--every`` minutes, reads what its
dashboard shows: per backend the Predictions page's actual / predicted TTFT (median and p90, and how
many requests had a first token) and ``/admin/api/bought``'s corrections and "saved against" totals.
Before issue #41 a non-streamed request's duration counted as its TTFT: the medians read 18-21 and
"saved against vllm" swung from 450 s to 3,011 s within twenty minutes. Prints one table per reading;
the last line says whether every median and correction is within 2x of 1 (the truth: a prediction
as long as the first token took).
"""

from __future__ import annotations

import argparse
import os
import re
import socket
import subprocess
import sys
import tempfile
import time
from typing import Any

import httpx

HEADER = (
    "| backend | requests with a TTFT | actual/predicted median | p90 | bought's correction "
    "| saved against it (s) |"
)


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port: int = sock.getsockname()[1]
        return port


def start(cache: str) -> tuple[subprocess.Popen[str], str, str]:
    port = free_port()
    env = {**os.environ, "TURNOUT_PORT": str(port), "TURNOUT_CACHE": cache}  # noqa: TID251 (the demo's, as a user sets it)
    env.pop("TURNOUT_ADMIN__TOKEN", None)
    process = subprocess.Popen(
        [sys.executable, "-m", "gateway", "demo"], env=env, stdout=subprocess.PIPE, text=True
    )
    assert process.stdout is not None
    banner = ""
    for line in process.stdout:
        banner += line
        if line.startswith("Ctrl-C"):
            break
    token = re.search(r"admin token: (\S+)\)", banner)
    assert token is not None, banner
    return process, f"http://127.0.0.1:{port}", token.group(1)


def reading(url: str, token: str, minutes: int) -> list[dict[str, Any]]:
    headers = {"authorization": f"Bearer {token}"}
    predictions = httpx.get(
        f"{url}/admin/api/predictions?minutes={minutes}", headers=headers, timeout=30
    ).json()
    bought = httpx.get(f"{url}/admin/api/bought", headers=headers, timeout=30).json()
    rows = []
    for backend in predictions["backends"]:
        name = backend["id"]
        rows.append(
            {
                "backend": name,
                "with_ttft": backend["requests"],
                "median": backend["median"],
                "p90": backend["p90"],
                "correction": bought["corrections"].get(name),
                "saved_against_s": (bought["total"].get(name) or {}).get("saved_s"),
            }
        )
    return rows


def within_2x(value: float | None) -> bool:
    return value is None or 0.5 <= value <= 2.0


def main() -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--minutes", type=float, default=20.0)
    parser.add_argument("--every", type=float, default=10.0, help="minutes between readings")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as cache:
        process, url, token = start(cache)
        try:
            started = time.monotonic()
            rows: list[dict[str, Any]] = []
            elapsed = 0.0
            while elapsed < args.minutes:
                time.sleep(
                    max(
                        0.0,
                        min(args.every, args.minutes - elapsed) * 60
                        - (time.monotonic() - started - elapsed * 60),
                    )
                )
                elapsed = (time.monotonic() - started) / 60
                rows = reading(url, token, max(1, round(elapsed)))
                print(f"\nafter {elapsed:.1f} min of the demo's traffic")
                print(HEADER)
                print("| --- | --- | --- | --- | --- | --- |")
                for row in rows:
                    print(
                        f"| {row['backend']} | {row['with_ttft']} | {row['median']} | {row['p90']} | "
                        f"{row['correction']} | {row['saved_against_s']} |"
                    )
            ok = all(within_2x(r["median"]) and within_2x(r["correction"]) for r in rows)
            print(f"\nevery median and correction within 2x of the truth: {'yes' if ok else 'NO'}")
            return 0 if ok else 1
        finally:
            process.terminate()
            process.wait(timeout=30)


if __name__ == "__main__":
    raise SystemExit(main())
