"""The routing decision's own cost, and a long prompt's (issue #15's scale targets).

    .venv/bin/python bench/decision.py [--requests 5000] [--sessions 10000] [--backends 16]

1. **A decision**: ``Lifecycle.route``, the one call that takes a request body to its route, on a
   core from ``gateway.core.build_core`` (as the gateway's): the model, the features
   (``policies.features.request_features``, without the per-message shape: the relay digests it once
   the request is on its way, as nothing routing decides reads it), the session lookup and the
   decision itself (``Router.route``: prefix match, slot leases, every candidate's estimate, the slot
   claim) against the in-memory state, no I/O, with ``--backends`` backends (half llama.cpp with 4
   slots, half vLLM) serving one model and ``--sessions`` sessions known (each with its prompt in the
   prefix index; the slots leased).
   Prints p50/p99/max per request (target: p99 <= 100 us). ``--in-flight N``: with N streams
   already in flight (spread over the backends, past their prefill, as in the streaming soak): what
   laying them over the snapshots costs a decision.
2. **A 60k-token request**: the gateway's CPU for the body decode, the shape checks and the features
   (canonical prompt, chained prefix hashes, per-message shape) of a ~60k-token chat body (target:
   <= 5 ms), as process time over repeated runs.
"""

from __future__ import annotations

import argparse
import asyncio
import statistics
import sys
import time
from pathlib import Path
from typing import Any

import httpx
import msgspec

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from backends.sent import Sent
from gateway.core import Core, build_core
from gateway.logging import configure_logging
from gateway.requests import parse_body
from gateway.settings import load_settings
from gateway.state.prefix_index import SentPrompt
from policies import Endpoint, EngineKind, Health, extract
from policies.types import BackendSnapshot, SessionView, SlotState

MODEL = "m"
SYSTEM = "You are a coding agent. Follow the repository's conventions. " * 100  # ~1.5k tokens


def conversation(n: int, turns: int = 3) -> dict[str, Any]:
    messages: list[dict[str, str]] = [{"role": "system", "content": SYSTEM}]
    for t in range(turns):
        messages.append({"role": "user", "content": f"Session {n}, turn {t}: fix the failing test. " * 20})
        messages.append({"role": "assistant", "content": f"Done with step {t} of session {n}. " * 10})
    messages.append({"role": "user", "content": f"Session {n}: now run the suite again."})
    return {"model": MODEL, "messages": messages, "max_tokens": 256, "stream": True}


def core_of(backends: int, sessions: int) -> Core:
    """The gateway's core over ``backends`` backends serving ``MODEL``, observed ready and idle."""
    kinds = [EngineKind.LLAMACPP if i % 2 == 0 else EngineKind.VLLM for i in range(backends)]
    names = [f"{kind.value}-{i}" for i, kind in enumerate(kinds)]
    settings = load_settings(
        None,
        backends=[
            {"id": name, "kind": kind.value, "url": f"http://127.0.0.1:9/{name}"}
            for name, kind in zip(names, kinds, strict=True)
        ],
        models=[
            {
                "name": MODEL,
                "architecture": "hybrid",
                "deployments": [
                    {"backend": n, "upstream_name": MODEL, "context_window": 65536} for n in names
                ],
            }
        ],
        profile="cost",
        state={"max_sessions": 2 * sessions},
    )
    core = build_core(settings, client=httpx.AsyncClient())
    now = time.time()
    for snapshot in core.fleet.snapshots():
        llama = snapshot.kind is EngineKind.LLAMACPP
        slots = tuple(SlotState(s, 65536, False) for s in range(4)) if llama else ()
        core.fleet.observe(  # what a probe would store: ready, idle
            BackendSnapshot(
                snapshot.backend_id,
                snapshot.kind,
                Health.READY,
                now,
                snapshot.deployments,
                slots=slots,
                total_slots=len(slots),
            )
        )
    return core


async def decisions(requests: int, sessions: int, backends: int, in_flight: int = 0) -> list[float]:
    core = core_of(backends, sessions)
    store, fleet = core.store, core.fleet
    names = [s.backend_id for s in fleet.snapshots()]
    for n in range(in_flight):  # streaming for a minute already: seen by the probes, prefilled
        fleet.begin(Sent(names[n % len(names)], None, time.time() - 60, 90.0, 0.0, 0.0))
    llama = [s.backend_id for s in fleet.snapshots() if s.kind is EngineKind.LLAMACPP]
    now = time.time()
    for n in range(sessions):  # each session's last prompt is where its last turn went
        features = extract(conversation(n, turns=2), Endpoint.CHAT, model=MODEL)
        backend, slot = llama[n % len(llama)], (n // len(llama)) % 4
        await store.record_prompt(SentPrompt(backend, slot, features.chain, features.prompt_tokens, f"s{n}"))
        await store.save_session(
            SessionView(
                f"s{n}", backend, slot, features.prompt_tokens, turns=2, last_seen=now, first_seen=now
            )
        )
        if n < len(llama) * 4:
            await store.claim_slot(backend, slot, f"s{n}", now, None, features.prompt_tokens)
    bodies = [conversation(n) for n in range(min(requests, sessions))]
    took = []
    for i in range(requests):
        n = (i * 7919) % len(bodies)
        headers = {"x-session-id": f"s{n}"}
        started = time.perf_counter()
        await core.lifecycle.route(bodies[n], Endpoint.CHAT, headers)
        took.append(time.perf_counter() - started)
    await fleet.adapter(llama[0]).client.aclose()
    return took


def long_request(repeats: int) -> tuple[int, int, float]:
    """Bytes, estimated tokens, and CPU ms per request of a ~60k-token body (median of ``repeats``)."""
    messages = [{"role": "system", "content": SYSTEM}]
    for t in range(120):
        messages.append(
            {"role": "user", "content": f"Turn {t}: read src/module_{t}.py and explain it. " * 30}
        )
        messages.append({"role": "assistant", "content": f"The module {t} defines the parser's state. " * 20})
    raw = msgspec.json.encode({"model": MODEL, "messages": messages, "stream": True})
    times, tokens = [], 0
    for _ in range(repeats):
        started = time.process_time()
        body = parse_body(raw, Endpoint.CHAT)
        tokens = extract(body, Endpoint.CHAT, model=MODEL).prompt_tokens
        times.append(time.process_time() - started)
    return len(raw), tokens, statistics.median(times) * 1000


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--requests", type=int, default=5000)
    parser.add_argument("--sessions", type=int, default=10_000)
    parser.add_argument("--backends", type=int, default=16)
    parser.add_argument("--repeats", type=int, default=50)
    parser.add_argument("--in-flight", type=int, default=0, help="streams already in flight")
    args = parser.parse_args(argv)
    configure_logging("console", "warning")  # the probes' "ready" lines are not the benchmark's
    took = sorted(asyncio.run(decisions(args.requests, args.sessions, args.backends, args.in_flight)))
    p50, p99 = took[len(took) // 2] * 1e6, took[int(len(took) * 0.99)] * 1e6
    print(
        f"decision (Lifecycle.route: model, features, session lookup, route, slot claim; in memory), "
        f"{args.backends} backends, "
        f"{args.sessions:,} sessions, {args.in_flight:,} streams in flight, {args.requests:,} requests:\n"
        f"  p50 {p50:.0f} us   p99 {p99:.0f} us   max {took[-1] * 1e6:.0f} us   "
        f"target p99 <= 100 us: {'PASS' if p99 <= 100 else 'MISS'}"
    )
    size, tokens, ms = long_request(args.repeats)
    print(
        f"long request: {size / 1024:.0f} KiB body, ~{tokens:,} tokens: body decode + checks + features "
        f"{ms:.2f} ms CPU (median of {args.repeats}); target <= 5 ms: {'PASS' if ms <= 5 else 'MISS'}"
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
