"""Routing reads one clock: the fleet's. On a virtual clock, leases, live sessions, the sessions'
expiry and the decision log move with virtual time and with nothing else (``backends.clock``)."""

from __future__ import annotations

import asyncio

import httpx

from backends.base import BackendSpec
from backends.clock import VirtualClock
from backends.fleet import Fleet
from gateway.completion import Completion, settle
from gateway.lifecycle import in_flight
from gateway.routing import Router
from gateway.state.memory import MemoryStore
from policies import BUILTIN_PROFILES, Architecture, Deployment, Endpoint, EngineKind, Health, extract
from policies.decision import Outcome
from policies.types import BackendSnapshot, SlotState, Usage

DEPLOYMENT = Deployment("m", "llama", "m", 65536, Architecture.HYBRID)
BODY = {"model": "m", "messages": [{"role": "user", "content": "Refactor the parser. " * 2000}]}
TTL_S, IDLE_S = 600.0, 120.0


async def scenario() -> None:
    clock = VirtualClock(100.0)
    store = MemoryStore(session_ttl_s=TTL_S, clock=clock.time)
    async with httpx.AsyncClient() as client:
        spec = BackendSpec("llama", EngineKind.LLAMACPP, "http://127.0.0.1:9", deployments=(DEPLOYMENT,))
        fleet = Fleet([spec], client, clock=clock)
        slots = (SlotState(0, 65536, False), SlotState(1, 65536, False))
        snapshot = BackendSnapshot(
            "llama",
            EngineKind.LLAMACPP,
            Health.READY,
            clock.time(),
            (DEPLOYMENT,),
            slots=slots,
            total_slots=2,
        )
        fleet.observe(snapshot)
        router = Router(fleet, store, BUILTIN_PROFILES["cost"], lease_idle_s=IDLE_S)
        assert router.clock is clock

        features = extract(BODY, Endpoint.CHAT, model="m", headers={"x-session-id": "agent-1"})
        features, session = await router.resolve_session(features)
        routed = await router.decide(features, session)
        (lease,) = await store.leases("llama")
        assert lease.last_used == clock.time()  # the lease is stamped in virtual time
        assert router.live.count(clock.time()) == 1

        sent = in_flight(routed.decision, clock.time(), features)
        assert not sent.stream  # its first token comes with its answer: the prediction stands meanwhile
        streamed = extract({**BODY, "stream": True}, Endpoint.CHAT, model="m")
        assert in_flight(routed.decision, clock.time(), streamed).stream  # its first token is seen
        token = fleet.begin(sent)
        clock.advance_to(130.0)
        assert fleet.load()["llama"].running == 1
        fleet.end(token)

        usage = Usage(features.prompt_tokens, 64, 0)
        outcome = Outcome("llama", "m", EngineKind.LLAMACPP, usage, 2.0, 30.0, len(str(BODY)), 0, True)
        await settle(router, Completion(routed, "r1", 200, None, outcome))
        assert [e["at"] for e in await store.decisions(10)] == [clock.time()]
        saved = await store.get_session("h:agent-1")
        assert saved is not None
        assert (saved.last_seen, saved.turns) == (clock.time(), 1)

        clock.advance_to(130.0 + IDLE_S + 1)  # silent past the idle window: no longer live
        assert router.live.count(clock.time()) == 0
        clock.advance_to(130.0 + TTL_S + 1)  # and past the sessions' TTL: forgotten
        assert await store.get_session("h:agent-1") is None


def test_routing_sessions_leases_and_the_decision_log_read_the_fleets_clock() -> None:
    asyncio.run(scenario())
