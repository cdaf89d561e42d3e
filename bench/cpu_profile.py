"""Where the gateway's CPU goes under the overhead harness's load (issue #15).

    .venv/bin/python bench/cpu_profile.py [--mode nonstream|stream] [--concurrency 32] [--duration 10]
                                          [--raw FILE] [--top 25]

Starts the harness's stub (``../shared/bench/overhead/stub.py`` on 127.0.0.1:9000, CPU 0) and
``turnout serve`` with ``bench/overhead.py``'s config (pinned to CPU 1), drives it with ``wrk``
(non-streaming, the harness's ``post.lua``) or the harness's stream client (64 chunks a stream), and
samples turnout with py-spy (``pip install py-spy``) meanwhile. Prints the functions with the most
own time, the most inclusive time, and the own time per package. Samples are taken only while a
thread runs Python (py-spy leaves idle threads out), so the shares are shares of turnout's CPU.
"""

from __future__ import annotations

import argparse
import collections
import os
import re
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from overhead import CONFIG, HARNESS, PORT, REPO

BENCH_HOME = os.environ.get("BENCH_HOME", str(Path.home() / ".cache" / "turnout-bench"))  # noqa: TID251 (the harness's)
BENCH_VENV = Path(BENCH_HOME) / "ovh-bench-venv"
FRAME = re.compile(r"^(?P<function>.*) \((?P<file>.*?)(?::(?P<line>\d+))?\)$")


def listening(port: int) -> bool:
    with socket.socket() as sock:
        return sock.connect_ex(("127.0.0.1", port)) == 0


def wait_listening(port: int, within_s: float = 20.0) -> None:
    deadline = time.monotonic() + within_s
    while not listening(port):
        if time.monotonic() > deadline:
            raise SystemExit(f"nothing listens on 127.0.0.1:{port} after {within_s:.0f} s")
        time.sleep(0.1)


def package(path: str) -> str:
    """A frame's package from py-spy's module-relative path (``httpcore/_async/http11.py``): the
    top-level package or module, ``stdlib`` for the standard library's."""
    top = path.split("/", 1)[0].removesuffix(".py")
    return f"stdlib ({top})" if top in sys.stdlib_module_names else top


def summarize(raw: Path, top: int) -> str:
    """py-spy's raw (collapsed stack) output -> own time per function and package, inclusive time."""
    own: collections.Counter[str] = collections.Counter()
    inclusive: collections.Counter[str] = collections.Counter()
    packages: collections.Counter[str] = collections.Counter()
    total = 0
    for line in raw.read_text(encoding="utf-8").splitlines():
        stack, _, count_text = line.rpartition(" ")
        if not stack or not count_text.isdigit():
            continue
        count = int(count_text)
        total += count
        named = [_name(frame) for frame in stack.split(";") if not frame.startswith("process ")]
        frames = [f for f in named if f is not None]
        if not frames:
            continue
        own[frames[-1][0]] += count
        packages[frames[-1][1]] += count
        for name in {name for name, _ in frames}:
            inclusive[name] += count
    if not total:
        return "no samples (is py-spy allowed to attach? it needs ptrace)"

    def table(title: str, counter: collections.Counter[str], limit: int) -> list[str]:
        rows = [f"{title} ({total:,} samples)", "| share | where |", "| ---: | --- |"]
        rows += [f"| {count / total:6.1%} | `{name}` |" for name, count in counter.most_common(limit)]
        return [*rows, ""]

    lines = table("Own time by package", packages, 15)
    lines += table("Own time by function", own, top)
    lines += table("Inclusive time by function", inclusive, top)
    return "\n".join(lines)


def _name(frame: str) -> tuple[str, str] | None:
    match = FRAME.match(frame.strip())
    if match is None:
        return None
    return f"{match['function']} ({match['file']})", package(match["file"])


def load(mode: str, concurrency: int, duration: float) -> subprocess.Popen[bytes]:
    url = f"http://127.0.0.1:{PORT}/v1"
    if mode == "nonstream":
        command = [
            "wrk", "-t1", f"-c{concurrency}", f"-d{duration:.0f}s",
            "-s", str(HARNESS / "post.lua"), url + "/chat/completions",
        ]  # fmt: skip
    else:
        command = [
            str(BENCH_VENV / "bin" / "python"), str(HARNESS / "stream_client.py"), "--url", url,
            "--concurrency", str(concurrency), "--requests", str(min(concurrency * 1000, 100_000)),
            "--max-seconds", f"{duration:.0f}",
        ]  # fmt: skip
    return subprocess.Popen(["taskset", "-c", "0", *command], stdout=subprocess.DEVNULL)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--mode", choices=("nonstream", "stream"), default="nonstream")
    parser.add_argument("--concurrency", type=int, default=32)
    parser.add_argument("--duration", type=float, default=10.0)
    parser.add_argument("--rate", type=int, default=250, help="py-spy samples per second")
    parser.add_argument("--raw", type=Path, default=None, help="keep py-spy's collapsed stacks here")
    parser.add_argument("--top", type=int, default=25)
    args = parser.parse_args(argv)
    spy = shutil.which("py-spy") or str(REPO / ".venv" / "bin" / "py-spy")
    for tool, hint in ((spy, "pip install py-spy"), ("wrk", "apt-get install -y wrk")):
        if not Path(tool).exists() and shutil.which(tool) is None:
            print(f"{tool} not found: {hint}", file=sys.stderr)
            return 2
    if not (BENCH_VENV / "bin" / "python").exists():
        subprocess.check_call(["bash", str(HARNESS / "run.sh"), "--help"], stdout=subprocess.DEVNULL)
    started: list[subprocess.Popen[bytes]] = []
    with tempfile.TemporaryDirectory(prefix="turnout-profile-") as directory:
        config = Path(directory) / "turnout.toml"
        config.write_text(CONFIG, encoding="utf-8")
        raw = args.raw or Path(directory) / "raw.txt"
        try:
            if not listening(9000):
                stub = [str(BENCH_VENV / "bin" / "python"), str(HARNESS / "stub.py")]
                started.append(subprocess.Popen(["taskset", "-c", "0", *stub], stdout=subprocess.DEVNULL))
                wait_listening(9000)
            turnout = [str(REPO / ".venv" / "bin" / "turnout"), "serve", "--config", str(config)]
            server = subprocess.Popen(["taskset", "-c", "1", *turnout], stdout=subprocess.DEVNULL)
            started.append(server)
            wait_listening(PORT)
            load(args.mode, args.concurrency, 2).wait()  # warm up: connections, learning, caches
            driver = load(args.mode, args.concurrency, args.duration + 1)
            subprocess.check_call(
                [spy, "record", "--pid", str(server.pid), "--rate", str(args.rate), "--format", "raw",
                 "--duration", f"{args.duration:.0f}", "--output", str(raw), "--nonblocking"],
                stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
            )  # fmt: skip
            driver.wait()
            print(f"turnout under {args.mode} load, c{args.concurrency}, {args.duration:.0f} s\n")
            print(summarize(raw, args.top))
        finally:
            for process in reversed(started):
                process.send_signal(signal.SIGTERM)
                try:
                    process.wait(10)
                except subprocess.TimeoutExpired:
                    process.kill()
    return 0


if __name__ == "__main__":
    sys.exit(main())
