"""Replay a trace through a real gateway (or the oracle) over real simulators, with compressed time.

Scheduling, in simulated seconds: request ``i`` arrives at ``t_i``; a request without a session is
sent at its arrival; a session's turns are sequential, so turn ``k`` is sent at
``max(t_k, end of turn k-1)``. Wall time runs ``time_scale`` times faster: a simulated instant ``s``
is wall ``t0 + s * time_scale``, and every measured wall duration ``d`` is reported as
``d / time_scale`` simulated seconds. Every request is streamed (``ignore_eos``, so it generates
exactly ``max_tokens``). The whole replay stops after ``wall_cap_s`` wall seconds; requests not done
by then are reported as errors.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass
from typing import Any

import httpx

from gateway.replay.client import Measured, stream_chat
from gateway.replay.oracle import Oracle
from gateway.replay.results import ORACLE, Result, request_body, request_headers
from gateway.replay.stack import start_stack
from gateway.replay.synth import threaded
from gateway.replay.traces import BLOCK_TOKENS, TraceRequest, conversations
from gateway.replay.workstation import StackOptions

START_LEAD_S = 0.05
"""Wall seconds between starting the replay clock and the first possible send."""

Dispatch = Callable[[httpx.AsyncClient, int, dict[str, Any], dict[str, str]], Awaitable[Measured]]
"""Send request ``index`` with this body and headers; return what was measured."""


@dataclass(frozen=True, slots=True)
class ReplayOptions:
    """How to replay: time compression, block size of the synthesized text, and the wall-clock cap."""

    time_scale: float = 0.05
    block_tokens: int = BLOCK_TOKENS
    wall_cap_s: float = 600.0


async def replay(
    requests: Sequence[TraceRequest], dispatch: Dispatch, options: ReplayOptions
) -> list[Result]:
    """Replay ``requests`` (their conversations threaded: ``synth.threaded``) through ``dispatch``
    (module docstring); results in trace order."""
    scale = options.time_scale
    results: dict[int, Result] = {}
    limits = httpx.Limits(max_connections=2000, max_keepalive_connections=200)
    async with httpx.AsyncClient(timeout=None, limits=limits) as client:
        t0 = time.monotonic() + START_LEAD_S

        async def run(indices: list[int]) -> None:
            for index in indices:
                request = requests[index]
                delay = t0 + request.t * scale - time.monotonic()
                if delay > 0:
                    await asyncio.sleep(delay)
                body, headers = request_body(request, options.block_tokens), request_headers(request)
                sent = time.monotonic()
                measured = await dispatch(client, index, body, headers)
                results[index] = Result(
                    index=index,
                    session=request.session,
                    arrival_s=request.t,
                    start_s=(sent - t0) / scale,
                    backend=measured.backend,
                    ttft_s=None if measured.ttft is None else measured.ttft / scale,
                    completion_s=measured.duration / scale,
                    prompt_tokens=measured.prompt_tokens,
                    cached_tokens=measured.cached_tokens,
                    completion_tokens=measured.completion_tokens,
                    error=measured.error,
                )

        tasks = [asyncio.create_task(run(g)) for g in conversations(requests)]
        _, pending = await asyncio.wait(tasks, timeout=options.wall_cap_s)
        for task in pending:
            task.cancel()
        await asyncio.gather(*pending, return_exceptions=True)
    return [
        results.get(i) or _missing(i, r, "not finished within the wall-clock cap")
        for i, r in enumerate(requests)
    ]


def _missing(index: int, request: TraceRequest, why: str) -> Result:
    return Result(index, request.session, request.t, request.t, None, None, 0.0, 0, 0, 0, why)


def gateway_dispatch(url: str) -> Dispatch:
    """Send every request to the gateway at ``url``."""

    async def send(
        client: httpx.AsyncClient, index: int, body: dict[str, Any], headers: dict[str, str]
    ) -> Measured:
        return await stream_chat(client, f"{url}/v1/chat/completions", body, headers)

    return send


def run_profile(
    requests: Sequence[TraceRequest], profile: str, stack: StackOptions, options: ReplayOptions
) -> list[Result]:
    """Replay on a fresh stack: a gateway with ``profile``, or the oracle when ``profile`` is ``oracle``;
    a conversation's turns as a chat client sends them (``synth.threaded``)."""
    requests = threaded(requests, options.block_tokens)
    running = start_stack(stack, None if profile == ORACLE else profile)
    try:
        if running.gateway is not None:
            dispatch = gateway_dispatch(running.gateway.url)
        else:
            urls = {name: server.url for name, server in running.sims.items()}
            dispatch = Oracle(requests, urls, stack.sim_configs()).dispatch
        return asyncio.run(replay(requests, dispatch, options))
    finally:
        running.stop()


def run_replay(
    requests: Sequence[TraceRequest],
    profiles: Sequence[str],
    stack: StackOptions,
    options: ReplayOptions,
    *,
    oracle: bool = True,
    on_done: Callable[[str, list[Result]], None] | None = None,
) -> dict[str, list[Result]]:
    """Replay once per profile (each on fresh simulators), then once with the oracle."""
    out: dict[str, list[Result]] = {}
    for profile in [*profiles, *([ORACLE] if oracle else [])]:
        out[profile] = run_profile(requests, profile, stack, options)
        if on_done is not None:
            on_done(profile, out[profile])
    return out
