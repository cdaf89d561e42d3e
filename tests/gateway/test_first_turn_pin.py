"""A first turn known only by its content is pinned to a free slot but holds no lease; a session
that proved to continue (its id, or a second turn) does. One-off traffic must never guard a slot
against an agent (the mixed benchmark lost its agents' slots to chat requests that way)."""

from __future__ import annotations

import asyncio
import time

import httpx

from backends.base import BackendSpec
from backends.fleet import Fleet
from gateway.routing import Router
from gateway.state.memory import MemoryStore
from policies import BUILTIN_PROFILES, Architecture, Deployment, Endpoint, EngineKind, Health, extract
from policies.types import BackendSnapshot, SlotState

DEPLOYMENT = Deployment("m", "llama", "m", 65536, Architecture.HYBRID)
BODY = {"model": "m", "messages": [{"role": "user", "content": "Refactor the parser. " * 2000}]}


async def first_turn(headers: dict[str, str]) -> tuple[int | None, list[str]]:
    """Route one first turn with llama.cpp the only backend; its slot and the leases afterwards."""
    store = MemoryStore()
    async with httpx.AsyncClient() as client:
        fleet = Fleet(
            [BackendSpec("llama", EngineKind.LLAMACPP, "http://127.0.0.1:9", deployments=(DEPLOYMENT,))],
            client,
        )
        slots = (SlotState(0, 65536, False), SlotState(1, 65536, False))
        fleet.observe(
            BackendSnapshot(
                "llama",
                EngineKind.LLAMACPP,
                Health.READY,
                time.time(),
                (DEPLOYMENT,),
                slots=slots,
                total_slots=2,
            )
        )
        router = Router(fleet, store, BUILTIN_PROFILES["cost"])
        features = extract(BODY, Endpoint.CHAT, model="m", headers=headers)
        features, session = await router.resolve_session(features)
        routed = await router.decide(features, session)
    return routed.decision.slot, [lease.session_key for lease in await store.leases("llama")]


def test_a_first_turn_known_by_content_is_pinned_without_a_lease() -> None:
    slot, leases = asyncio.run(first_turn({}))
    assert slot is not None  # pinned: llama-server's own choice cannot evict someone's warm slot
    assert leases == []


def test_a_named_session_holds_its_slot() -> None:
    slot, leases = asyncio.run(first_turn({"x-session-id": "agent-1"}))
    assert slot is not None
    assert leases == ["h:agent-1"]  # the header's key
