"""A routed request ends once, as one event through the completion pipeline (``gateway.completion``):
the decision log entry, a trace line, the timeline, learning and the session's next state, in that
order, then one batch of store writes."""

from __future__ import annotations

import asyncio

import httpx

from backends.base import BackendSpec
from backends.clock import VirtualClock
from backends.fleet import Fleet
from gateway.completion import STEPS, Completion, Step, settle
from gateway.routing import Router
from gateway.state.memory import MemoryStore
from policies import BUILTIN_PROFILES, Architecture, Deployment, Endpoint, EngineKind, Health, extract
from policies.decision import Outcome
from policies.types import BackendSnapshot, SlotState, Usage

DEPLOYMENT = Deployment("m", "llama", "m", 65536, Architecture.HYBRID)
BODY = {"model": "m", "messages": [{"role": "user", "content": "Refactor the parser. " * 500}]}


def test_the_steps_run_in_their_order() -> None:
    names = [step.__name__ for step in STEPS]
    assert names == ["log_entry", "record_traffic", "timeline", "learning", "next_session", "turn_ended"]


async def scenario(
    outcome_given: bool, homes: list[dict[str, int]] | None = None
) -> tuple[MemoryStore, list[tuple[str, int | None]]]:
    clock = VirtualClock(100.0)
    store = MemoryStore(clock=clock.time)
    async with httpx.AsyncClient() as client:
        spec = BackendSpec("llama", EngineKind.LLAMACPP, "http://127.0.0.1:9", deployments=(DEPLOYMENT,))
        fleet = Fleet([spec], client, clock=clock)
        slots = (SlotState(0, 65536, False),)
        fleet.observe(
            BackendSnapshot(
                "llama", EngineKind.LLAMACPP, Health.READY, clock.time(), (DEPLOYMENT,), slots=slots
            )
        )
        router = Router(fleet, store, BUILTIN_PROFILES["cost"])
        features = extract(BODY, Endpoint.CHAT, model="m", headers={"x-session-id": "agent-1"})
        routed = await router.route(features, BODY)
        if homes is not None:
            homes.append(router.homes.counts(clock.time()))
        usage = Usage(features.prompt_tokens, 64, 0)
        outcome = Outcome("llama", "m", EngineKind.LLAMACPP, usage, 2.0, 30.0, len(str(BODY)), 0, True)
        seen: list[tuple[str, int | None]] = []

        def spy(router: Router, done: Completion) -> None:
            seen.append((done.entry["request_id"], done.session.turns if done.session else None))

        steps: tuple[Step, ...] = (*STEPS, spy)
        done = Completion(
            routed, "r1", 200 if outcome_given else 502, None, outcome if outcome_given else None
        )
        await settle(router, done, steps)
        assert done.at == clock.time()
        if homes is not None:
            clock.advance_to(clock.monotonic() + router.homes.active_s - 1.0)
            homes.append(router.homes.counts(clock.time()))
            clock.advance_to(clock.monotonic() + 2.0)
            homes.append(router.homes.counts(clock.time()))
        if outcome_given:
            assert router.learned.deployments["llama/m"].prefill_tok_s.samples == 1
    return store, seen


def test_an_answered_request_is_logged_learned_and_moves_its_session_on_in_one_pass() -> None:
    store, seen = asyncio.run(scenario(outcome_given=True))
    assert seen == [("r1", 1)]  # a later step reads what the earlier ones made
    saved = asyncio.run(store.get_session("h:agent-1"))
    assert saved is not None
    assert saved.turns == 1
    assert [e["request_id"] for e in asyncio.run(store.decisions(10))] == ["r1"]


def test_a_request_without_an_answer_writes_its_decision_only() -> None:
    store, seen = asyncio.run(scenario(outcome_given=False))
    assert seen == [("r1", None)]
    assert asyncio.run(store.get_session("h:agent-1")) is None
    (entry,) = asyncio.run(store.decisions(10))
    assert entry["status"] == 502
    assert entry["outcome"] is None


def test_a_turn_s_end_starts_its_session_s_last_seconds_at_home() -> None:
    """Routed, the session is at home on its backend; settled, it stays ``active_s`` more
    (``gateway.live.Homes``: a crowded llama-server's count), answered or not."""
    for answered in (True, False):
        homes: list[dict[str, int]] = []
        asyncio.run(scenario(outcome_given=answered, homes=homes))
        assert homes == [{"llama": 1}, {"llama": 1}, {}]
