"""Sessions that share one system prompt, as coding agents send them, replayed in virtual time with
``cost`` as it is and with the prefix index blind to a prompt's head (what turnout did before: it saw
a new session's system prompt in a slot only in whole 1 KiB chunks, which end before the checkpoint
llama-server took where the first user message starts).

    .venv/bin/python bench/head_digest_experiment.py [--system 6000] [--sessions 24] [--gap 20]
                                                     [--draws 6] [--chat]

Each draw: ``--sessions`` sessions arriving ``--gap`` s apart on average (exponential), each of 1, 2,
3, 6 or 10 turns (a subagent's few calls to a long task's many), all on one system prompt of
``--system`` tokens as a system message; a first user message of 300-1,500 tokens, then each turn
the previous answer (80-400 tokens) and a tool result of 200-2,000 tokens; turns 2-6 s apart when the
answer allows. Agents' calls (judged on the last token) unless ``--chat``. The workstation fleet of
bench/routing.py, the toy tokenizer's tokens. Prints each variant's mean and p90 of the TTFT and of
the time to the last token over every draw's requests. No benchmark row has system messages (their
prompts are one user message, then the conversation), so no row or validation row moves with the head.
"""

from __future__ import annotations

import argparse
import random
import statistics
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))

from routing import workload_settings
from routing_workloads import MODEL, WORKLOADS

import gateway.state.prefix_index as prefix_index
from gateway.logging import configure_logging
from gateway.replay.report import percentile
from gateway.replay.simulate import simulate
from gateway.replay.traces import TraceRequest
from gateway.replay.virtual import VirtualOptions

LETTERS = "abcdefghijklmnopqrstuvwxyz"
TURNS = (1, 2, 3, 6, 10)


def words(rng: random.Random, n: int) -> str:
    """``n`` four-letter words: about ``n`` tokens of the simulators' toy tokenizer."""
    return " ".join("".join(rng.choice(LETTERS) for _ in range(4)) for _ in range(n))


def trace(seed: int, system_tokens: int, sessions: int, gap_s: float, agent: bool) -> list[TraceRequest]:
    """One draw (module docstring)."""
    rng = random.Random(seed)
    system = {"role": "system", "content": words(random.Random(999), system_tokens)}
    out: list[TraceRequest] = []
    start = 0.0
    for s in range(sessions):
        start += rng.expovariate(1 / gap_s)
        messages: list[dict[str, Any]] = [
            system,
            {"role": "user", "content": words(rng, rng.randint(300, 1500))},
        ]
        t = start
        for _ in range(rng.choice(TURNS)):
            answer = rng.randint(80, 400)
            out.append(TraceRequest(t, f"s{s}", MODEL, 0, (), answer, messages=tuple(messages), agent=agent))
            messages = [
                *messages,
                {"role": "assistant", "content": words(rng, answer)},
                {"role": "user", "content": words(rng, rng.randint(200, 2000))},
            ]
            t += rng.uniform(2.0, 6.0)
    return sorted(out, key=lambda r: r.t)


def replay(requests: list[TraceRequest], head: bool) -> tuple[list[float], list[float]]:
    """``cost``'s TTFTs and times to the last token on ``requests``; ``head`` False: the index never
    keeps a slot's head (``prefix_index._head``)."""
    original = prefix_index._head
    if not head:
        prefix_index._head = lambda sent, previous, checkpoints: (None, 0)
    try:
        settings_for = workload_settings(next(w for w in WORKLOADS if w.name == "agent"))
        runs = simulate(requests, ["cost"], settings_for, MODEL, VirtualOptions(), oracle=False)
    finally:
        prefix_index._head = original
    done = [r for r in runs.runs["cost"] if r.ok and r.ttft_s is not None]
    if len(done) != len(requests):
        raise SystemExit(f"{len(requests) - len(done)} of {len(requests)} requests failed")
    return [r.ttft_s for r in done if r.ttft_s is not None], [r.completion_s for r in done]


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--system", type=int, default=6000, help="system prompt tokens")
    parser.add_argument("--sessions", type=int, default=24)
    parser.add_argument("--gap", type=float, default=20.0, help="mean seconds between sessions' starts")
    parser.add_argument("--draws", type=int, default=6)
    parser.add_argument("--chat", action="store_true", help="chats (judged on the TTFT), not agents")
    args = parser.parse_args(argv)
    configure_logging("json", "warning")
    for head in (False, True):
        ttft: list[float] = []
        last: list[float] = []
        for seed in range(args.draws):
            a, b = replay(trace(seed, args.system, args.sessions, args.gap, not args.chat), head)
            ttft += a
            last += b
        print(
            f"{'with the head' if head else 'without'}: {len(last)} requests, "
            f"TTFT {statistics.fmean(ttft):.3f}/{percentile(ttft, 0.9):.3f} s, "
            f"last token {statistics.fmean(last):.3f}/{percentile(last, 0.9):.3f} s (mean/p90)",
            flush=True,
        )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
