"""How long the admin pages take to render with a full store: 10,000 decisions, 1,000 sessions.

    .venv/bin/python bench/dashboard.py [--decisions 10000] [--sessions 1000] [--turns 50] [--runs 20]

Each page and API endpoint is requested ``--runs`` times in-process (litestar's TestClient: no
network, so the time is the server's), logged in with a bearer token; the median and the worst are
printed in milliseconds. The target (issue #11): under 200 ms a page.
"""

from __future__ import annotations

import argparse
import asyncio
import statistics
import sys
import time
from typing import Any

from litestar.testing import TestClient

from gateway.app import create_app
from gateway.logging import configure_logging
from gateway.settings import load_settings
from policies.sessions import session_label
from policies.types import SessionView

TOKEN = "bench-token"
TARGET_MS = 200.0


def decision(index: int, now: float) -> dict[str, Any]:
    backend = "llama" if index % 3 else "vllm"
    candidate = {
        "score": 0.9, "components": {"ttft": 0.9}, "expected_cached_tokens": 20_000, "predicted_ttft_s": 0.8,
        "predicted_total_s": 3.1, "next_turn_s": 0.7, "objective_s": 3.0, "queue_s": 0.0, "slot": 0,
        "warm": True, "cache_source": "slot", "evicts": None, "evict_cost_s": 0.0, "note": "warm slot 0",
    }  # fmt: skip
    return {
        "at": now - (10_000 - index) * 0.3, "request_id": f"req-{index:06d}", "model": "qwen3.8-27b",
        "endpoint": "chat.completions", "profile": "cost", "session": session_label(f"h:s{index % 1000}"),
        "session_source": "header", "prompt_tokens_estimate": 24_000, "prompt_tokens_exact": False,
        "prompt_tokens_counted": "added", "chosen": backend, "slot": 0 if backend == "llama" else None,
        "reason": "lowest-predicted-ttft; warm slot 0",
        "candidates": [{**candidate, "backend": "vllm", "slot": None}, {**candidate, "backend": "llama"}],
        "rejected": [], "moved": None, "status": 200, "error": None,
        "outcome": {"status": 200, "ttft_s": 0.9, "duration_s": 3.2, "prompt_tokens": 24_100,
                    "cached_tokens": 23_500, "completion_tokens": 200},
    }  # fmt: skip


async def fill(store: Any, decisions: int, sessions: int, turns: int) -> None:
    now = time.time()
    for index in range(decisions):
        await store.record_decision(decision(index, now))
    for index in range(sessions):
        key = f"h:s{index}"
        await store.save_session(
            SessionView(
                key=key,
                backend_id="llama",
                slot=index % 2,
                prompt_tokens=24_000,
                turns=turns,
                last_seen=now,
                source="header",
                first_seen=now - 3600,
                total_prompt_tokens=600_000,
                total_cached_tokens=560_000,
                saved_s=190.0,
            )
        )
        for turn in range(turns):
            broke = None if turn % 10 else {"kind": "edited", "message": 3, "role": "user", "offset": 512,
                                            "cause": "message 3 (user) was edited at character ~512",
                                            "lost_tokens": 9000, "lost_s": 3.0}  # fmt: skip
            await store.record_turn(key, {
                "at": now - (turns - turn) * 30, "request_id": f"req-{index}-{turn}", "backend": "llama",
                "slot": 0, "prompt_tokens": 1000 * turn, "cached_tokens": 990 * turn,
                "expected_cached_tokens": 990 * turn, "predicted_ttft_s": 0.4, "ttft_s": 0.5, "break": broke,
            })  # fmt: skip


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--decisions", type=int, default=10_000)
    parser.add_argument("--sessions", type=int, default=1_000)
    parser.add_argument("--turns", type=int, default=50)
    parser.add_argument("--runs", type=int, default=20)
    args = parser.parse_args(argv)
    configure_logging("json", "error")
    settings = load_settings(
        None,
        backends=[
            {"id": "vllm", "kind": "vllm", "url": "http://127.0.0.1:9", "probe_interval_s": 3600},
            {"id": "llama", "kind": "llamacpp", "url": "http://127.0.0.1:9", "probe_interval_s": 3600},
        ],
        models=[{"name": "qwen3.8-27b", "architecture": "hybrid", "deployments": [
            {"backend": "vllm", "upstream_name": "q", "context_window": 94_000},
            {"backend": "llama", "upstream_name": "q", "context_window": 65_536}]}],
        state={"decision_log_size": args.decisions, "max_sessions": max(args.sessions, 1)},
        admin={"token": TOKEN},
    )  # fmt: skip
    app = create_app(settings)
    label = session_label("h:s7")
    paths = [
        "/admin", "/admin/decisions", "/admin/decisions/req-009999", "/admin/sessions",
        f"/admin/sessions/{label}", "/admin/policy", "/admin/api/overview", "/admin/api/decisions?limit=100",
        "/admin/api/sessions", f"/admin/api/sessions/{label}", "/admin/api/series?minutes=60",
        "/admin/predictions", "/admin/api/predictions?minutes=60", "/admin/slots?minutes=60",
        "/admin/slots?minutes=1440", "/admin/api/slots?minutes=60", "/admin/whatif", "/admin/api/whatif",
        "/admin/api/bought",
    ]  # fmt: skip
    worst_median = 0.0
    with TestClient(app) as client:
        asyncio.run(fill(app.state.core.router.store, args.decisions, args.sessions, args.turns))
        headers = {"authorization": f"Bearer {TOKEN}"}
        print(f"{args.decisions} decisions, {args.sessions} sessions x {args.turns} turns; {args.runs} runs")
        print(f"{'path':<44} {'median ms':>10} {'max ms':>10}")
        for path in paths:
            times = []
            for _ in range(args.runs):
                started = time.perf_counter()
                response = client.get(path, headers=headers)
                times.append((time.perf_counter() - started) * 1000)
                if response.status_code != 200:
                    print(f"{path}: HTTP {response.status_code}", file=sys.stderr)
                    return 1
            median = statistics.median(times)
            worst_median = max(worst_median, median)
            print(f"{path:<44} {median:>10.1f} {max(times):>10.1f}")
    verdict = "PASS" if worst_median <= TARGET_MS else "MISS"
    print(f"slowest median {worst_median:.1f} ms (target <= {TARGET_MS:.0f} ms): {verdict}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
