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


def llama_router(client: httpx.AsyncClient, store: MemoryStore) -> Router:
    """A cost router whose one backend is an idle llama-server of two slots."""
    fleet = Fleet(
        [BackendSpec("llama", EngineKind.LLAMACPP, "http://127.0.0.1:9", deployments=(DEPLOYMENT,))], client
    )
    slots = (SlotState(0, 65536, False), SlotState(1, 65536, False))
    fleet.observe(
        BackendSnapshot(
            "llama", EngineKind.LLAMACPP, Health.READY, time.time(), (DEPLOYMENT,), slots=slots, total_slots=2
        )
    )
    return Router(fleet, store, BUILTIN_PROFILES["cost"])


async def first_turn(headers: dict[str, str]) -> tuple[int | None, list[str]]:
    """Route one first turn with llama.cpp the only backend; its slot and the leases afterwards."""
    store = MemoryStore()
    async with httpx.AsyncClient() as client:
        router = llama_router(client, store)
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


SYSTEM = "You are a coding agent. Tools: read_file, write_file, run_tests, grep. " * 120  # ~8 KB


async def look_ahead(bodies: list[dict[str, object]], follows: int) -> list[float]:
    """The look-ahead (turns) of each body routed as a first turn, after ``follows`` conversations
    with the first body's system prompt came back for a second turn and as many one-offs did not."""
    async with httpx.AsyncClient() as client:
        router = llama_router(client, MemoryStore())
        agents = extract(bodies[0], Endpoint.CHAT, model="m", headers={}).chain.family
        for n in range(follows):
            router.follow_ups.first_turn(agents)
            router.follow_ups.second_turn(agents)
            router.follow_ups.first_turn(hash(f"one-off {n}"))
        out = []
        for body in bodies:
            features = extract(body, Endpoint.CHAT, model="m", headers={})
            features, session = await router.resolve_session(features)
            best = (await router.decide(features, session)).decision.chosen_candidate
            assert best is not None
            assert best.estimate is not None
            out.append(best.estimate.horizon)
        return out


def test_a_first_turn_looks_ahead_by_its_prompt_familys_follow_up_rate() -> None:
    """Agents' first turns (one harness's system prompt) come back, one-off requests do not: each
    first turn bets on its next turns by its own family's record, not by the two kinds' mix."""
    messages = [{"role": "system", "content": SYSTEM}, {"role": "user", "content": "Fix issue #12"}]
    agent = {"model": "m", "messages": messages}
    one_off = {"model": "m", "messages": [{"role": "user", "content": "Translate this letter. " * 400}]}
    agent_turns, one_off_turns = asyncio.run(look_ahead([agent, one_off], follows=20))
    assert agent_turns > 2.5  # LOOKAHEAD_TURNS (3) x a rate near 1
    assert one_off_turns < 1.6  # a family never seen: the global rate, about 1/2 here
