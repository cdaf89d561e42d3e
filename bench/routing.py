"""The routing benchmark: four workloads x five profiles + the hindsight oracle, on the simulators.

    .venv/bin/python bench/routing.py [--quick] [--out docs/benchmarks.md] [--json results.json]

Workloads (all deterministic, seed 0; every scaling is printed next to the numbers):

* ``agent``: 2 agents (= the llama.cpp slots), 30 turns each, 4k -> 60k tokens; time scale 0.1.
* ``chat``: 100 independent requests over 60 s; time scale 0.05.
* ``mixed``: 2 agents x 16 turns (4k -> 60k) + 80 chat requests over 60 s; time scale 0.05.
* ``mooncake``: the first 300 requests of the Mooncake conversation trace (~102 s), token lengths x 0.1
  (blocks of 51 tokens); time scale 0.05.
* ``contention-N`` (N = 1, 2, 4, 8 agents on the 2 llama.cpp slots): N agents x 12 turns over a shared
  6k-token system prompt, +1.2k-3.8k tokens a turn, answers 80-400 tokens, plus one-shot requests of
  1.5k-9k tokens every ~7 s; with ``x-session-id``, and again as ``contention-N-nosession`` without
  (Mooncake-style: sessions only by content); time scale 0.1. Profiles: cost, prefer-vllm,
  prefer-llamacpp, least-loaded and the oracle.

The stack per run: a vLLM simulator (hybrid, no prefix caching, 94k window) and a llama.cpp simulator
(hybrid, 2 slots of 64k), DOMAIN.md rates, behind a fresh gateway (or the oracle).
"""

from __future__ import annotations

import argparse
import datetime as dt
import json
import os
import platform
import sys
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from gateway.logging import configure_logging
from gateway.replay.generate import agent_trace, chat_trace, contention_trace, mixed_trace, without_sessions
from gateway.replay.report import median_report, report, table
from gateway.replay.runner import ReplayOptions, run_replay
from gateway.replay.stack import StackOptions
from gateway.replay.traces import TraceRequest, block_tokens, read_trace, scale_tokens, with_model

REPO = Path(__file__).resolve().parents[1]
MOONCAKE = REPO.parent / "shared" / "traces" / "mooncake-conversation.jsonl"
PROFILES = ("cost", "least-loaded", "prefer-vllm", "prefer-llamacpp", "round-robin")
CONTENTION_PROFILES = ("cost", "prefer-vllm", "prefer-llamacpp", "least-loaded")
CONTENTION_AGENTS = (1, 2, 4, 8)
CONTENTION_REPEATS = 3
"""One contention run swings by 20-40% with machine load (2 shared cores, 10x time compression)."""
PREVIOUS = {"agent": 1.00, "chat": 1.05, "mixed": 1.11}
"""The ratios the targets read, as docs/benchmarks.md recorded them on 2026-11-30 (to keep or improve)."""
MODEL = "replay"
OTHERS = "<!-- other benchmarks: kept when this file is regenerated -->"


@dataclass(frozen=True)
class Workload:
    name: str
    scaling: str
    time_scale: float
    make: Callable[[bool], list[TraceRequest]]
    token_scale: float = 1.0
    profiles: tuple[str, ...] = PROFILES
    repeats: int = 1
    """Runs per profile; the table shows each number's median over them (``median_report``)."""


def _mooncake(quick: bool) -> list[TraceRequest]:
    requests = read_trace(MOONCAKE, "mooncake", model=MODEL, limit=100 if quick else 300)
    return scale_tokens(requests, 0.1)


def _contention(agents: int, sessions: bool) -> Callable[[bool], list[TraceRequest]]:
    def make(quick: bool) -> list[TraceRequest]:
        requests = contention_trace(agents=agents, turns=4 if quick else 12, seed=agents, model=MODEL)
        return requests if sessions else without_sessions(requests)

    return make


def _contention_workloads() -> tuple[Workload, ...]:
    out = []
    for agents in CONTENTION_AGENTS:
        for sessions in (True, False):
            name = f"contention-{agents}" + ("" if sessions else "-nosession")
            scaling = (
                f"{agents} agents x 12 turns on 2 llama.cpp slots, 6k shared system prompt, +1.2k-3.8k "
                "tokens a turn, answers 80-400, one-shots of 1.5k-9k tokens every ~7 s; "
                + ("x-session-id given" if sessions else "no session ids")
                + "; time scale 0.1"
            )
            out.append(
                Workload(
                    name,
                    scaling + f"; median of {CONTENTION_REPEATS} runs",
                    0.1,
                    _contention(agents, sessions),
                    profiles=CONTENTION_PROFILES,
                    repeats=CONTENTION_REPEATS,
                )
            )
    return tuple(out)


WORKLOADS = (
    Workload(
        "agent",
        "2 agents x 30 turns, 4k -> 60k tokens, answers 64-256 tokens; time scale 0.1",
        0.1,
        lambda quick: agent_trace(agents=2, turns=10 if quick else 30, seed=0, model=MODEL),
    ),
    Workload(
        "chat",
        "100 independent requests over 60 s, prompts 2.1k-5.1k tokens, answers 32-320; time scale 0.05",
        0.05,
        lambda quick: chat_trace(requests=40 if quick else 100, duration=60.0, seed=0, model=MODEL),
    ),
    Workload(
        "mixed",
        "2 agents x 16 turns (4k -> 60k) + 80 chat requests over 60 s; time scale 0.05",
        0.05,
        lambda quick: mixed_trace(
            agents=2, turns=6 if quick else 16, requests=30 if quick else 80, seed=0, model=MODEL
        ),
    ),
    Workload(
        "mooncake",
        "first 300 requests of mooncake-conversation.jsonl (~102 s), token lengths x 0.1; time scale 0.05",
        0.05,
        _mooncake,
        token_scale=0.1,
    ),
    *_contention_workloads(),
)


def run(workload: Workload, quick: bool) -> dict[str, Any]:
    requests = with_model(workload.make(quick), MODEL)
    stack = StackOptions(model=MODEL, time_scale=workload.time_scale)
    options = ReplayOptions(
        time_scale=workload.time_scale, block_tokens=block_tokens(workload.token_scale), wall_cap_s=300
    )
    started = time.monotonic()
    reports = []
    for attempt in range(workload.repeats):
        runs = run_replay(
            requests,
            workload.profiles,
            stack,
            options,
            on_done=lambda name, _: print(f"  {workload.name}/{name} done", file=sys.stderr),
        )
        reports.append(report(runs))
        if workload.repeats > 1:
            print(f"  {workload.name}: run {attempt + 1} of {workload.repeats} done", file=sys.stderr)
    meta = {
        "workload": workload.name,
        "scaling": workload.scaling,
        "requests": len(requests),
        "time_scale": workload.time_scale,
        "runs": workload.repeats,
        "wall_s": round(time.monotonic() - started, 1),
    }
    return median_report(reports, meta)


def _ratio(a: float | None, b: float | None) -> str:
    return f"{a / b:.2f}x" if a is not None and b else "n/a"


def targets(results: dict[str, dict[str, Any]]) -> list[str]:
    """The issue's targets, each with the measured value and PASS/MISS."""
    lines: list[str] = []
    agent = results.get("agent", {}).get("profiles", {})
    if agent:
        cost, oracle, vllm = agent["cost"], agent["oracle"], agent["prefer-vllm"]
        vs_oracle = cost["ttft_mean_s"] / oracle["ttft_mean_s"]
        long_c, long_v = cost["ttft_mean_long_s"], vllm["ttft_mean_long_s"]
        speedup = long_v / long_c if long_c and long_v else 0.0
        lines.append(
            f"- agent: cost mean TTFT / oracle = {vs_oracle:.2f}x (target <= 1.05x; "
            f"{PREVIOUS['agent']:.2f}x on 2026-11-30): "
            f"{'PASS' if vs_oracle <= 1.05 else 'MISS'}"
        )
        lines.append(
            f"- agent, prompts >= 30k: prefer-vllm / cost mean TTFT = {speedup:.1f}x (target >= 10x): "
            f"{'PASS' if speedup >= 10 else 'MISS'}"
        )
    for name in ("chat", "mixed"):
        profiles = results.get(name, {}).get("profiles", {})
        if not profiles:
            continue
        best = max(profiles[p]["throughput_tok_s"] or 0.0 for p in ("prefer-vllm", "prefer-llamacpp"))
        got = profiles["cost"]["throughput_tok_s"] or 0.0
        ok = got >= 0.95 * best
        lines.append(
            f"- {name}: cost throughput / best single-engine = {_ratio(got, best)} (target >= 0.95x; "
            f"{PREVIOUS[name]:.2f}x on 2026-11-30): {'PASS' if ok else 'MISS'}"
        )
    return lines + contention_targets(results)


def _verdict(ok: bool) -> str:
    return "PASS" if ok else "MISS"


def contention_targets(results: dict[str, dict[str, Any]]) -> list[str]:
    """Issue #9: every contention row against the oracle and the single-engine profiles; the rows
    without session ids against the same workload with them."""
    lines: list[str] = []
    for agents in CONTENTION_AGENTS:
        for suffix in ("", "-nosession"):
            name = f"contention-{agents}{suffix}"
            profiles = results.get(name, {}).get("profiles", {})
            if not profiles:
                continue
            cost, oracle = profiles["cost"], profiles["oracle"]
            ttft, completion = cost["ttft_mean_s"], cost["completion_mean_s"]
            singles = max(profiles[p]["ttft_mean_s"] for p in ("prefer-vllm", "prefer-llamacpp"))
            lowest = min(profiles[p]["ttft_mean_s"] for p in ("prefer-vllm", "prefer-llamacpp"))
            ok_ttft = ttft <= 1.15 * oracle["ttft_mean_s"]
            ok_single = ttft <= lowest
            ok_completion = completion <= 1.15 * oracle["completion_mean_s"]
            lines.append(
                f"- {name}: cost TTFT / oracle = {_ratio(ttft, oracle['ttft_mean_s'])} (<= 1.15x): "
                f"{_verdict(ok_ttft)}; <= both single-engine profiles ({ttft:.2f} s vs {lowest:.2f} / "
                f"{singles:.2f} s): {_verdict(ok_single)}; completion / oracle = "
                f"{_ratio(completion, oracle['completion_mean_s'])} (<= 1.15x): {_verdict(ok_completion)}"
            )
            with_ids = results.get(f"contention-{agents}", {}).get("profiles", {})
            if suffix and with_ids:
                base = with_ids["cost"]["ttft_mean_s"]
                hit, oracle_hit = cost["cache_hit_ratio"] or 0.0, oracle["cache_hit_ratio"] or 0.0
                lines.append(
                    f"- {name}: cost TTFT / with session ids = {_ratio(ttft, base)} (<= 1.2x): "
                    f"{_verdict(ttft <= 1.2 * base)}; cache hit {hit:.3f} vs oracle {oracle_hit:.3f} "
                    f"(>= 0.8x): {_verdict(hit >= 0.8 * oracle_hit)}"
                )
    return lines


def machine() -> str:
    cpu = platform.processor() or platform.machine()
    return f"{cpu}, {os.cpu_count()} cores, Python {platform.python_version()}"


NOTES = """\
## Notes (read before quoting a number)

- **What changed for issue #9.** llama.cpp's RAM prompt cache is on in the simulator (as in the real
  server: an evicted slot's state comes back when its session is pinned again, within the cache's
  8 GiB); turnout finds reuse by content (the prefix index), prices evictions instead of taking the
  least recently used slot, counts a request as in flight from the moment it is sent (a queued
  llama.cpp stream has no headers yet: before this, six sessions could all queue on one slot, each
  told it would wait 0.1 s), predicts a busy slot's wait from the requests turnout has there and
  corrects its queue predictions by how much longer queues really were, expects contention to last
  into a session's next turn, and starts an engine nobody has sent to yet from its priors times the
  speed measured on the others. Earlier runs of the issue's own 6-agent workload: `cost` 6.4 s mean
  TTFT (oracle 3.2 s, prefer-vllm 3.7 s); in Mooncake format 20.4 s with a cache hit ratio of 0.
- **Without session ids the replay paces turns the same way.** A session-less request that resends a
  previous one's whole prompt is sent after that one's answer (an agent does not send its next turn
  before), and the oracle sees those conversations too, so the `-nosession` rows differ from the
  others only in what the gateway is told.
- **The oracle is greedy.** It knows the true state and each conversation's future turns but plans one
  request at a time and ignores the queueing of future turns, so a profile can beat it (agent and
  contention rows). It does not go through the gateway.
- **Gateway overhead does not compress.** A 30-60k-token request costs the gateway tens of
  milliseconds of wall time (JSON, hashing, feature extraction) plus the simulator's tokenizer;
  divided by the time scale (0.1) that is a few tenths of a simulated second added to every gateway
  TTFT, not to the oracle's.
- **The 10x agent target needs small turns.** A warm hybrid slot still re-prefills the turn's growth
  plus the 516 tokens after its last checkpoint: with ~1.9k tokens of growth per turn that is ~0.8 s at
  3000 tok/s, against ~8-9 s for vLLM re-prefilling 30-60k: ~10x at best, before any overhead.
- **Contention rows are medians of 3 runs**, each number separately (errors: the most any run had):
  one run of the same trace swings 20-40% with machine load (`cost` on contention-8 measured 2.9-4.9 s
  mean TTFT on one day). **A new pin is weighed by the chance it lasts** (`slots / live sessions`,
  docs/routing.md): before, with 8 agents, session ids made `cost` worse than none (4.5 s against
  2.8 s: every first turn outbid the slot holders); now contention-8 is 0.87x the oracle.
- **Without session ids, a first turn looks ahead by the follow-up rate** (docs/routing.md): the share
  of first turns known only by content that came back lately, and only while a llama.cpp slot is free.
  Before (2026-12-01, morning), 2 and 4 agents stayed at 1.14-1.22x the oracle: first turns started on
  vLLM and moving a conversation to llama.cpp at its second turn cost a full prefill there. Such first
  turns are pinned but hold no lease (a first try that leased them let chat requests guard slots
  against the agents: mixed fell to 1.05x). A rate learned per prompt head was tried and dropped.
- **A learning fix moved contention-8 without session ids over its cache-hit target.** The full run
  of 2026-12-01 (morning) measured its cache hit at 0.77x the oracle's (target 0.8x). Its decision log
  showed why: a session's first turn on a slot that held another conversation sharing only the 6k
  system prompt reused nothing (a hybrid slot restores whole prompts or checkpoints near their end,
  not a prefix inside them), and learning counted that as "0 of 6k reused", dropping the learned
  reuse ratio to ~0.69: the session's next warm turns were predicted 0.65-0.7x of what they got and
  often lost to vLLM. Learning now measures reuse against what the slot rules allow
  (`policies.slots.usable`; nothing, there), and those predictions are within ~1% (0.90x the oracle's
  cache hit in this run, at 0.83x its mean TTFT). With session ids, contention-8's cache hit is 0.78x
  the oracle's (no target there): with 8 agents on 2 slots `cost` keeps the slot holders and sends
  the others to vLLM when a slot's queue or a full re-prefill on llama.cpp costs more; the oracle,
  greedy, rotates sessions through the slots more often and pays for it in TTFT (1.15x cost's).
- **Chat and Mooncake are bursts of one-shot requests.** Everything (clients, gateway, simulators)
  shares one Python process on 2 busy cores, and per-request gateway CPU turns into queueing that the
  time scale (0.05) magnifies 20x; the oracle sends straight to the engines. Numbers vary by run with
  machine load: compare profiles within one table, not across runs. (Chat is one run per profile:
  on 2026-12-01 the morning's full run measured 0.91x, a re-run of the chat row minutes later 1.14x.)
  Between the morning's run and this one the relay's CPU per request fell by more than half (issue
  #15, docs/benchmarks.md "Gateway overhead": the aiohttp transport) and cost's mean TTFT on chat went
  13.3 -> 7.6 s, mixed 12.1 -> 6.6 s, Mooncake 14.5 -> 2.5 s: the queueing these rows magnify is
  mostly the gateway's own.
- **Queue predictions under bursts (2026-12-02).** A full run that morning measured chat at 0.63x
  the best single engine; at that code the chat row went wrong in 4 runs of 8 (cost sent 28-41%
  to llama.cpp instead of ~15%), while one run at each of 7 earlier commits did not. Two causes,
  both fixed (docs/routing.md): requests queued on one llama.cpp slot each counted down their
  predicted total from when they were sent, as if running (a queued burst looked nearly free), and
  the learned queue factor fell to 0.1 on
  samples that measured the priors (a start-up burst) or a faster prefill (a short queue), so every
  later queue was scaled down tenfold. After the fix the same row gave 13-14% to llama.cpp in 6 runs
  of 6. **Mooncake stays the noisiest row** (no target rides on it): in this run cost's mean TTFT is
  15.6 s against prefer-vllm's 3.6 s; the row re-run minutes later gave 10.7 against 5.6, and
  session 6's code (ab2b7e5), run right after, 29.4 against 24.5 (its table had 2.5 against 3.3).
  Measured inside the gateway (first token from its request's arrival), cost's Mooncake TTFT was
  1.5-2.3 s in 3 runs: what the clients see on top is the one shared process's queueing.
"""


def markdown(results: dict[str, dict[str, Any]], quick: bool) -> str:
    out = [
        "# Routing benchmark",
        "",
        f"Generated by `bench/routing.py{' --quick' if quick else ''}` on {dt.date.today().isoformat()}, "
        f"{machine()} (shared with other jobs). Seconds are **simulated** seconds (wall time divided by the "
        "time scale). See `docs/replay.md` for the method and the oracle.",
        "",
        "Stack per run: vLLM simulator (hybrid, no prefix caching, 94k window), llama.cpp simulator "
        "(hybrid, 2 slots x 64k, RAM prompt cache on at its 8 GiB default with 64 KiB of state per token "
        "and 64 MiB per recurrent state or checkpoint), DOMAIN.md rates (vLLM 6600/64 tok/s, llama.cpp "
        "3000/109 tok/s prefill/decode), a fresh gateway per profile, probes every 0.1 wall s.",
        "",
    ]
    for name, result in results.items():
        meta = result["meta"]
        out += [
            f"## {name}",
            "",
            f"Scaling: {meta['scaling']}. {meta['requests']} requests; wall {meta['wall_s']} s for all runs.",
            "",
            table(result["profiles"]),
            "",
        ]
    out += ["## Targets (issues #5 and #9)", "", *targets(results), "", NOTES]
    return "\n".join(out)


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--quick", action="store_true", help="smaller workloads (a smoke run)")
    parser.add_argument("--only", action="append", choices=[w.name for w in WORKLOADS], default=None)
    parser.add_argument("--out", type=Path, default=REPO / "docs" / "benchmarks.md")
    parser.add_argument("--json", type=Path, default=None)
    parser.add_argument(
        "--from-json",
        type=Path,
        default=None,
        help="start from a saved --json: re-render it, re-running only the --only workloads",
    )
    args = parser.parse_args(argv)
    configure_logging("json", "warning")
    results: dict[str, dict[str, Any]] = {}
    if args.from_json is not None:
        results = json.loads(args.from_json.read_text(encoding="utf-8"))
    for workload in WORKLOADS if args.from_json is None or args.only else ():
        if args.only and workload.name not in args.only:
            continue
        if workload.name == "mooncake" and not MOONCAKE.exists():
            print(f"skipping mooncake: {MOONCAKE} not found", file=sys.stderr)
            continue
        print(f"{workload.name}: {workload.scaling}", file=sys.stderr)
        results[workload.name] = run(workload, args.quick)
        print(table(results[workload.name]["profiles"]))
    text = markdown(results, args.quick)
    print("\n".join(targets(results)))
    if args.json is not None:
        args.json.write_text(json.dumps(results, indent=2) + "\n", encoding="utf-8")
    kept = args.out.read_text(encoding="utf-8").partition(OTHERS)[2] if args.out.exists() else ""
    args.out.write_text(text + ("\n" + OTHERS + kept if kept else ""), encoding="utf-8")
    return 0


if __name__ == "__main__":
    sys.exit(main())
