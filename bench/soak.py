"""The streaming soak (issue #15): many concurrent streams through turnout for minutes, every byte checked.

    .venv/bin/python bench/soak.py [--streams 1000] [--minutes 10] [--tokens 32] [--decode-tok-s 2]
                                   [--probes 20] [--json FILE]

Starts a vLLM simulator (``turnout sim``: no batch slowdown, room for every stream) and ``turnout
serve`` (its own config, the simulator as its only backend) as processes on 127.0.0.1, then keeps
``--streams`` streams open through turnout for ``--minutes``: each stream asks for a ``--tokens``
answer at ``--decode-tok-s`` tokens a second, and when it ends its worker starts another.
``--probes`` more workers send the same requests straight to the simulator, in the same run: the
difference between the two is what turnout adds.

The simulator answers deterministically (the same prompt gives the same text), so every answer's
text is compared with the simulator's own answer to that prompt, asked once at the start: bytes
lost or duplicated on the way must be 0, and every stream must end with ``[DONE]``, once.

Prints, and checks: lost and duplicated bytes (0), streams that failed (0), stalls (a gap between
two events of more than ``--stall-s``: 0), turnout's RSS once every stream is open and at the end
(within 10%); prints turnout's CPU (share of one core) and p50/p99 of TTFT and total time through
turnout and direct. Bounded in time (``--minutes``, plus one stream's length to finish) and count
(``--streams + --probes`` workers).

``--upstream stub`` relays the overhead harness's stub instead (``../shared/bench/overhead/stub.py``,
an ``openai`` backend; the same answer to every prompt, checked byte for byte all the same): the
simulator cannot serve thousands of streams on a 2-core machine, the stub can. The scale target
(5,000 streams in one process, < 1 GB RSS, no stall)::

    .venv/bin/python bench/soak.py --upstream stub --streams 5000 --minutes 4 --tokens 16 \
        --decode-tok-s 0.2 --stall-s 10
"""

from __future__ import annotations

import argparse
import asyncio
import json
import math
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import httpx
from soak_report import Stream, Tally, gc_pauses, report

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # run as a script: tests/ is importable
from backends.transport import AiohttpTransport
from tests.e2e.processes import SimProcess
from tests.real.llama_server import free_port

REPO = Path(__file__).resolve().parents[1]
STUB = REPO.parent / "shared" / "bench" / "overhead" / "stub.py"
MODEL = "soak"
PROMPTS = 64
CONFIG = """\
log_level = "warning"
port = {port}

[admin]
token = "soak-bench"

[[backends]]
id = "sim"
kind = "{kind}"
url = "{url}"

[[models]]
name = "{model}"
[[models.deployments]]
backend = "sim"
upstream_name = "{model}"
"""


def prompt(n: int) -> str:
    return f"Soak request {n % PROMPTS}: say something about streams."


def body(n: int, tokens: int, stream: bool = True) -> dict[str, Any]:
    return {
        "model": MODEL,
        "messages": [{"role": "user", "content": prompt(n)}],
        "max_tokens": tokens,
        "stream": stream,
    }


async def one(client: httpx.AsyncClient, url: str, payload: dict[str, Any]) -> Stream:
    started = time.monotonic()
    ttft, last, gap, parts, done = None, started, 0.0, [], 0
    try:
        async with client.stream("POST", url, json=payload) as response:
            if response.status_code != 200:
                await response.aread()
                return Stream(None, 0.0, 0.0, "", 0, f"status {response.status_code}")
            buffer = b""
            async for chunk in response.aiter_bytes():
                now = time.monotonic()
                gap, last = max(gap, now - last), now
                buffer += chunk
                *events, buffer = buffer.split(b"\n\n")
                for event in events:
                    data = event.removeprefix(b"data: ")
                    if ttft is None:
                        ttft = now - started
                    if data == b"[DONE]":
                        done += 1
                        continue
                    choices = json.loads(data).get("choices") or [{}]
                    parts.append((choices[0].get("delta") or {}).get("content") or "")
    except (httpx.HTTPError, ValueError) as exc:
        return Stream(ttft, time.monotonic() - started, gap, "".join(parts), done, f"{type(exc).__name__}")
    return Stream(ttft, time.monotonic() - started, gap, "".join(parts), done)


def cpu_s(pid: int) -> float:
    """The process's CPU time so far (user + system), from ``/proc``."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def rss_mib(pid: int) -> float:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024
    return math.nan


async def soak(args: argparse.Namespace, turnout_url: str, sim_url: str, pid: int) -> dict[str, Any]:
    limits = httpx.Limits(max_connections=args.streams + args.probes + 10, max_keepalive_connections=None)
    timeout = httpx.Timeout(args.stall_s * 4, connect=30.0)
    transport = AiohttpTransport(
        limits
    )  # httpx's own pool is slow with 1,000 connections (docs/decisions.md)
    async with httpx.AsyncClient(limits=limits, timeout=timeout, transport=transport) as client:
        stream_s = args.tokens / args.decode_tok_s
        whole = httpx.Timeout(stream_s * 2 + 30, connect=30.0)  # a plain answer comes all at once, at the end

        async def reference(n: int) -> str:
            url = sim_url + "/v1/chat/completions"
            if args.upstream == "stub":  # the same answer to every prompt, asked as a stream
                streamed = await one(client, url, body(n, args.tokens))
                if streamed.error is not None or streamed.done != 1:
                    raise SystemExit(f"the stub's reference answer failed: {streamed.error}")
                return streamed.content
            answer = await client.post(url, json=body(n, args.tokens, False), timeout=whole)
            return str(answer.json()["choices"][0]["message"]["content"] or "")

        expected = dict(enumerate(await asyncio.gather(*map(reference, range(PROMPTS)))))
        deadline = time.monotonic() + args.minutes * 60
        through, direct = Tally(), Tally()
        rss: dict[str, float] = {"idle": rss_mib(pid)}
        cpu: dict[str, float] = {}

        async def worker(index: int, url: str, tally: Tally, share: int) -> None:
            await asyncio.sleep(stream_s * index / share)  # spread: one stream's length for all
            n = index
            while time.monotonic() < deadline:
                answer = await one(client, url + "/v1/chat/completions", body(n, args.tokens))
                tally.check(answer, expected[n % PROMPTS])
                n += share

        async def sample() -> None:
            await asyncio.sleep(stream_s * 1.5)  # every stream has started
            rss["open"] = rss["peak"] = rss_mib(pid)
            cpu["open"], cpu["opened_at"] = cpu_s(pid), time.monotonic()
            while time.monotonic() < deadline:
                await asyncio.sleep(5)
                rss["peak"] = max(rss["peak"], rss_mib(pid))
                rss["end"] = rss_mib(pid)
                cpu["end"], cpu["ended_at"] = cpu_s(pid), time.monotonic()

        tasks = [worker(i, turnout_url, through, args.streams) for i in range(args.streams)]
        tasks += [worker(i, sim_url, direct, args.probes) for i in range(args.probes)]
        await asyncio.gather(sample(), *tasks)
        scraped = await client.get(turnout_url + "/metrics")
    return {"through": through, "direct": direct, "rss": rss, "cpu": cpu, "gc": gc_pauses(scraped.text)}


class StubProcess:
    """The overhead harness's upstream stub (``../shared/bench/overhead/stub.py``: raw asyncio protocol,
    precomputed answers) on a free loopback port: ``tokens`` content chunks ``1 / decode_tok_s`` apart."""

    def __init__(self, tokens: int, decode_tok_s: float) -> None:
        self.port = free_port()
        self.command = [
            sys.executable,
            str(STUB),
            "--port",
            str(self.port),
            "--model",
            MODEL,
            "--chunks",
            str(tokens + 2),
            "--delay-ms",
            str(1000 / decode_tok_s),
        ]  # fmt: skip  (the stub's first and last chunks carry no content)
        self.process: subprocess.Popen[bytes] | None = None

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def start(self) -> None:
        if not STUB.exists():
            raise SystemExit(f"--upstream stub needs the overhead harness: {STUB} is missing")
        self.process = subprocess.Popen(self.command, stdout=subprocess.DEVNULL)
        for _ in range(300):
            if self.process.poll() is not None:
                raise SystemExit(f"the stub exited with {self.process.returncode}")
            try:
                if httpx.get(self.url + "/health", timeout=1).status_code == 200:
                    return
            except httpx.HTTPError:
                time.sleep(0.1)
        raise SystemExit("the stub did not answer /health")

    def stop(self) -> None:
        if self.process is not None:
            self.process.terminate()
            self.process.wait(30)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--streams", type=int, default=1000)
    parser.add_argument("--minutes", type=float, default=10.0)
    parser.add_argument("--tokens", type=int, default=32, help="answer length of each stream")
    parser.add_argument("--decode-tok-s", type=float, default=2.0, help="each stream's token rate")
    parser.add_argument("--probes", type=int, default=20, help="workers sending straight to the simulator")
    parser.add_argument("--stall-s", type=float, default=5.0)
    parser.add_argument("--json", type=Path, default=None)
    parser.add_argument(
        "--upstream", choices=("sim", "stub"), default="sim",
        help="what turnout relays: the vLLM simulator, or the overhead harness's raw-protocol stub "
        "(thousands of streams: the simulator cannot serve them on a small machine)",
    )  # fmt: skip
    args = parser.parse_args(argv)
    sim: SimProcess | StubProcess
    if args.upstream == "stub":
        sim = StubProcess(args.tokens, args.decode_tok_s)
    else:
        sim = SimProcess(
            "vllm", MODEL, "--max-num-seqs", str(4 * (args.streams + args.probes)), "--batch-slowdown", "0",
            "--decode-tok-s", str(args.decode_tok_s), "--prefill-tok-s", "1000000", "--no-tool-calls",
        )  # fmt: skip
    sim.start()
    port = free_port()
    with tempfile.TemporaryDirectory(prefix="turnout-soak-") as directory:
        config = Path(directory) / "turnout.toml"
        kind = "openai" if args.upstream == "stub" else "vllm"
        config.write_text(CONFIG.format(port=port, kind=kind, url=sim.url, model=MODEL), encoding="utf-8")
        server = subprocess.Popen(
            [str(REPO / ".venv" / "bin" / "turnout"), "serve", "--config", str(config)],
            stdout=subprocess.DEVNULL,
        )
        try:
            url = f"http://127.0.0.1:{port}"
            for _ in range(300):
                if server.poll() is not None:
                    raise SystemExit(f"turnout serve exited with {server.returncode}")
                try:
                    if httpx.get(url + "/health", timeout=1).status_code == 200:
                        break
                except httpx.HTTPError:
                    time.sleep(0.1)
            result = asyncio.run(soak(args, url, sim.url, server.pid))
        finally:
            server.terminate()
            server.wait(30)
            sim.stop()
    text, summary, ok = report(args, result)
    print(text)
    if args.json is not None:
        args.json.write_text(json.dumps(summary, indent=2) + "\n", encoding="utf-8")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
