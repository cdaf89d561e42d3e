"""The relay's background warm-ups (``gateway.warming.Warming``) on the simulators: in flight on the
fleet while they run, each its own task, cancelled when the gateway stops or drains."""

from __future__ import annotations

import asyncio
from collections.abc import Iterator
from typing import Any

import httpx
import pytest
from structlog.testing import capture_logs

from backends.sim import SimConfig, create_sim_app
from gateway.core import build_core
from policies import Architecture, Endpoint
from tests.e2e.conftest import stack_settings
from tests.servers import ServerThread

SYSTEM = " ".join(f"rule{i % 50} keeps the agent on task" for i in range(700))
BODY: dict[str, Any] = {
    "model": "m-both",
    "messages": [{"role": "system", "content": SYSTEM}, {"role": "user", "content": "start"}],
    "max_tokens": 200,
}


@pytest.fixture(scope="module")
def engines() -> Iterator[dict[str, str]]:
    """vLLM fast, llama.cpp at real speed: a warm-up of ~6k tokens takes about two seconds."""
    configs = {
        "vllm": SimConfig(kind="vllm", model="up-vllm", time_scale=0.002, architecture=Architecture.HYBRID),
        "llama": SimConfig(kind="llamacpp", model="up-llama", time_scale=1.0, slots=2),
    }
    servers = {name: ServerThread(create_sim_app(config)).start() for name, config in configs.items()}
    try:
        yield {name: server.url for name, server in servers.items()}
    finally:
        for server in servers.values():
            server.stop()


async def warming_up(urls: dict[str, str], stop: bool) -> tuple[int, int, bool]:
    """Route a session's first turn, start its warm-up, then stop it (``close``) or let it end:
    warm-ups running and requests in flight on llama.cpp just after it started, and whether it
    ended with nothing left in flight."""
    async with httpx.AsyncClient(timeout=30) as client:
        core = build_core(stack_settings(urls), client=client)
        await core.fleet.start()
        try:
            routed = await core.lifecycle.route(dict(BODY), Endpoint.CHAT, {"x-session-id": "warm"})
            assert routed.warm is not None
            assert routed.warm.backend_id == "llama"
            warming = core.lifecycle.warming
            warming.start(Endpoint.CHAT, BODY, routed)
            started = (warming.running, core.fleet.own("llama").requests)
            if stop:
                await warming.close()
            else:
                for _ in range(600):
                    if not warming.running:
                        break
                    await asyncio.sleep(0.05)
            return *started, not warming.running and core.fleet.own("llama").requests == 0
        finally:
            await core.fleet.stop()


def test_a_warm_up_is_in_flight_until_it_ends(engines: dict[str, str]) -> None:
    assert asyncio.run(warming_up(engines, stop=False)) == (1, 1, True)


def test_stopping_cancels_the_warm_ups_in_flight(engines: dict[str, str]) -> None:
    """The gateway stopping, or draining (``Relay.drain``: no client waits for a warm-up), ends them
    at once and takes them off the fleet."""
    assert asyncio.run(warming_up(engines, stop=True)) == (1, 1, True)


def test_a_warm_up_that_fails_is_logged_and_leaves_nothing_in_flight(engines: dict[str, str]) -> None:
    """The engine went away between the decision and the warm-up: nothing but the warm slot is lost."""
    llama = ServerThread(
        create_sim_app(SimConfig(kind="llamacpp", model="up-llama", time_scale=1.0, slots=2))
    )
    llama.start()

    async def scenario() -> tuple[bool, bool]:
        async with httpx.AsyncClient(timeout=30) as client:
            core = build_core(stack_settings({**engines, "llama": llama.url}), client=client)
            await core.fleet.start()
            try:
                routed = await core.lifecycle.route(dict(BODY), Endpoint.CHAT, {"x-session-id": "gone"})
                llama.stop()  # refused from now on
                with capture_logs() as logs:
                    core.lifecycle.warming.start(Endpoint.CHAT, BODY, routed)
                    for _ in range(200):
                        if not core.lifecycle.warming.running:
                            break
                        await asyncio.sleep(0.05)
                failed = any(entry["event"] == "warm_up.failed" for entry in logs)
                return failed, core.fleet.own("llama").requests == 0
            finally:
                await core.fleet.stop()

    assert asyncio.run(scenario()) == (True, True)
