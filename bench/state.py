"""What the Redis state store costs: per request, and in Redis memory per session.

    .venv/bin/python bench/state.py [--requests 2000] [--sessions 100000]

Starts a redis-server on a free loopback port (Debian's package). Per request: the store calls one
routed turn makes (read the session and the leases, match the prefix index, claim the slot; when it
ends, record its prompt for the other replicas, then one batch: the session, the turn and the
decision), timed against the in-memory store in the same run; median and p90 in ms. Memory:
``used_memory`` before and after saving ``--sessions`` sessions of a 40-message conversation (prompt
mark and per-message shape, what turnout saves), divided by their number. Targets (issue #13): under
1 ms p50 per request, under 2 KB per session at 100,000 sessions.
"""

from __future__ import annotations

import argparse
import asyncio
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import redis.asyncio as redis

from gateway.state import MemoryStore, SentPrompt, StateStore
from gateway.state.redis_store import RedisStore
from policies.prefix import chain_of, render
from policies.shape import shape_of
from policies.types import SessionView

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # run as a script: tests/ is importable
from tests.redis_server import RedisServer

MESSAGES = [{"role": "system", "content": "You are a coding agent. " * 300}] + [
    {"role": "user" if i % 2 else "assistant", "content": f"turn {i}: " + "some code and prose " * 80}
    for i in range(39)
]


def session(key: str, now: float) -> SessionView:
    return SessionView(
        key=key, backend_id="llama", slot=0, prompt_tokens=40_000, cached_tokens=39_000, turns=20,
        last_seen=now,
        prompt=chain_of(render(MESSAGES)).mark, shape=shape_of(MESSAGES), source="header", first_seen=now,
        total_prompt_tokens=400_000, total_cached_tokens=380_000, saved_s=130.0,
    )  # fmt: skip


CHAIN = chain_of(render(MESSAGES))


async def one_turn(store: StateStore, key: str, view: SessionView, entry: dict[str, Any]) -> None:
    await store.get_session(key)
    await store.leases("llama")
    await store.match_prefix(CHAIN, ["llama", "vllm"])
    await store.claim_slot("llama", 0, key, time.time(), key, 40_000)
    await store.record_prompt(SentPrompt("llama", 0, CHAIN, 40_000, key))
    await store.finish_turn(
        view, {"at": time.time(), "prompt_tokens": 40_000, "cached_tokens": 39_000}, entry
    )


async def per_request(store: StateStore, requests: int) -> list[float]:
    view, entry = session("bench", time.time()), {"request_id": "r", "candidates": [{"backend": "llama"}] * 2}
    times = []
    for _ in range(requests):
        started = time.perf_counter()
        await one_turn(store, "bench", view, entry)
        times.append((time.perf_counter() - started) * 1000)
    return times


async def memory_per_session(url: str, sessions: int) -> float:
    client = redis.Redis.from_url(url)
    store = RedisStore(url, prefix="mem", max_sessions=sessions + 1)
    before = (await client.info("memory"))["used_memory"]
    now = time.time()
    for index in range(sessions):
        await store.save_session(session(f"h:agent-{index}", now))
    after = (await client.info("memory"))["used_memory"]
    await store.close()
    await client.aclose()
    return float(after - before) / sessions


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--requests", type=int, default=2000)
    parser.add_argument("--sessions", type=int, default=100_000)
    args = parser.parse_args(argv)
    with tempfile.TemporaryDirectory() as directory:
        server = RedisServer(Path(directory)).start()
        try:
            loop = asyncio.new_event_loop()
            shared = RedisStore(server.url, prefix="bench")
            redis_ms = loop.run_until_complete(per_request(shared, args.requests))
            memory_ms = loop.run_until_complete(per_request(MemoryStore(), args.requests))
            loop.run_until_complete(shared.close())
            per_session = loop.run_until_complete(memory_per_session(server.url, args.sessions))
        finally:
            server.stop()

    def line(name: str, times: list[float]) -> str:
        p90 = statistics.quantiles(times, n=10)[-1]
        return f"{name:<8} p50 {statistics.median(times):7.3f} ms   p90 {p90:7.3f} ms"

    print(f"store calls of one routed turn, {args.requests} turns each, Redis on loopback:")
    print(line("redis", redis_ms))
    print(line("memory", memory_ms))
    added = statistics.median(redis_ms) - statistics.median(memory_ms)
    print(f"Redis adds {added:.3f} ms p50 per request (target < 1 ms): {'PASS' if added < 1 else 'MISS'}")
    print(
        f"Redis memory: {per_session:,.0f} bytes per session at {args.sessions:,} sessions "
        f"(target < 2,048): {'PASS' if per_session < 2048 else 'MISS'}"
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
