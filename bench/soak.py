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
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx
from prometheus_client.parser import text_string_to_metric_families

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


@dataclass
class Stream:
    ttft: float | None
    total: float
    longest_gap: float
    content: str
    done: int
    error: str | None = None


@dataclass
class Tally:
    """What one side (through turnout, or direct) saw."""

    streams: list[Stream] = field(default_factory=list)
    failed: list[str] = field(default_factory=list)
    lost: int = 0
    duplicated: int = 0
    wrong: int = 0

    def check(self, stream: Stream, expected: str) -> None:
        self.streams.append(stream)
        if stream.error is not None or stream.done != 1:
            self.failed.append(stream.error or f"[DONE] seen {stream.done} times")
        got, want = stream.content.encode(), expected.encode()
        self.lost += max(0, len(want) - len(got))
        self.duplicated += max(0, len(got) - len(want))
        if got != want and len(got) == len(want):
            self.wrong += 1


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


def gc_pauses(exposition: str) -> dict[str, dict[str, float]]:
    """Per generation, from turnout's ``turnout_gc_pause_seconds``: collections, seconds in all, and
    the smallest bucket bound every pause was under."""
    samples = [
        sample
        for family in text_string_to_metric_families(exposition)
        if family.name == "turnout_gc_pause_seconds"
        for sample in family.samples
    ]
    pauses: dict[str, dict[str, float]] = {}
    for sample in samples:
        mine = pauses.setdefault(sample.labels["generation"], {})
        if sample.name.endswith("_count"):
            mine["collections"] = sample.value
        elif sample.name.endswith("_sum"):
            mine["seconds"] = round(sample.value, 3)
    for sample in samples:  # cumulative buckets, ascending: the first that holds them all
        mine = pauses[sample.labels["generation"]]
        done = "longest_under_s" in mine or sample.value < mine.get("collections", 0)
        if sample.name.endswith("_bucket") and not done:
            mine["longest_under_s"] = float(sample.labels["le"])
    return pauses


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


def pct(values: list[float], p: float) -> float:
    if not values:
        return math.nan
    values = sorted(values)
    return values[min(len(values) - 1, round((len(values) - 1) * p / 100))]


def report(args: argparse.Namespace, result: dict[str, Any]) -> tuple[str, dict[str, Any], bool]:
    through, direct, rss, cpu = result["through"], result["direct"], result["rss"], result["cpu"]
    core = (cpu.get("end", math.nan) - cpu.get("open", math.nan)) / (
        cpu.get("ended_at", math.nan) - cpu.get("opened_at", math.nan)
    )  # share of one core while every stream was open

    def timings(tally: Tally) -> dict[str, float]:
        ok = [s for s in tally.streams if s.error is None and s.ttft is not None]
        ttft, total = [s.ttft for s in ok if s.ttft is not None], [s.total for s in ok]
        return {
            "ttft_p50_ms": pct(ttft, 50) * 1000,
            "ttft_p99_ms": pct(ttft, 99) * 1000,
            "total_p50_ms": pct(total, 50) * 1000,
            "total_p99_ms": pct(total, 99) * 1000,
        }

    mine, floor = timings(through), timings(direct)
    stalls = sum(1 for s in through.streams if s.longest_gap > args.stall_s)
    growth = rss.get("end", math.nan) / rss.get("open", math.nan) - 1
    summary = {
        "streams": args.streams,
        "minutes": args.minutes,
        "completed": len(through.streams),
        "failed": len(through.failed),
        "failures": sorted(set(through.failed))[:5],
        "lost_bytes": through.lost,
        "duplicated_bytes": through.duplicated,
        "wrong_content": through.wrong,
        "stalls": stalls,
        "rss_mib": {k: round(v, 1) for k, v in rss.items()},
        "rss_growth": round(growth, 3),
        "cpu_core_share": round(core, 3),
        "gc_pauses": result["gc"],
        "through": {k: round(v, 1) for k, v in mine.items()},
        "direct": {k: round(v, 1) for k, v in floor.items()},
        "added_p99_ms": {
            "ttft": round(mine["ttft_p99_ms"] - floor["ttft_p99_ms"], 1),
            "total": round(mine["total_p99_ms"] - floor["total_p99_ms"], 1),
        },
        "direct_completed": len(direct.streams),
        "direct_failed": len(direct.failed),
    }
    ok = (
        not through.failed
        and through.lost == 0
        and through.duplicated == 0
        and through.wrong == 0
        and stalls == 0
        and abs(growth) <= 0.10
    )
    lines = [
        f"Soak: {args.streams} concurrent streams x {args.minutes:g} min through turnout "
        f"({args.tokens} tokens at {args.decode_tok_s:g} tok/s each), {args.probes} direct for comparison",
        f"- streams completed {len(through.streams):,}, failed {len(through.failed)}"
        + (f" ({'; '.join(summary['failures'])})" if through.failed else ""),
        f"- bytes lost {through.lost}, duplicated {through.duplicated}, answers altered {through.wrong}",
        f"- turnout RSS: {rss['idle']:.0f} MiB idle, {rss.get('open', math.nan):.0f} MiB with every stream "
        f"open, {rss.get('end', math.nan):.0f} MiB at the end ({growth:+.1%}), peak "
        f"{rss.get('peak', math.nan):.0f} MiB",
        f"- turnout CPU while every stream was open: {core:.1%} of one core",
        "- turnout's garbage collector: "
        + ", ".join(
            f"gen{g} {p.get('collections', 0):,.0f} collections, {p.get('seconds', 0) * 1000:,.0f} ms, "
            f"longest <= {p.get('longest_under_s', 0):g} s"
            for g, p in sorted(result["gc"].items())
        ),
        f"- stalls (a gap over {args.stall_s:g} s between events): {stalls}",
        "| | TTFT p50 | TTFT p99 | total p50 | total p99 |",
        "| --- | ---: | ---: | ---: | ---: |",
        *(
            f"| {name} | {t['ttft_p50_ms']:.1f} ms | {t['ttft_p99_ms']:.1f} ms | "
            f"{t['total_p50_ms']:.0f} ms | {t['total_p99_ms']:.0f} ms |"
            for name, t in (("through turnout", mine), ("direct", floor))
        ),
        f"- added p99: TTFT {summary['added_p99_ms']['ttft']:+.1f} ms, total "
        f"{summary['added_p99_ms']['total']:+.1f} ms",
        f"- {'PASS' if ok else 'FAIL'}: nothing lost, duplicated or failed, no stall; RSS flat within 10%",
    ]
    return "\n".join(lines), summary, ok


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
