"""Background warm-ups in the virtual replay (``gateway.warming``, ``policies.warm``): a named
session's first turn answered on vLLM while its prompt is prefilled into a llama.cpp slot, so its
next turn there is warm; what the engine and the decision log say of it. The fleet's vLLM is 0.24,
which keeps nothing of a hybrid model's conversation (on 0.25 the session stays on vLLM)."""

from __future__ import annotations

import dataclasses

from msgspec.structs import replace

from backends.sim import SimConfig
from gateway.replay.fleets import default_fleet
from gateway.replay.traces import TraceRequest, parse_turnout
from gateway.replay.virtual import GatewayReplay, run_now
from gateway.replay.workstation import StackOptions
from gateway.settings import Settings

MODEL = "replay"
BLOCK = 512
VLLM_024 = "seed-5090-vllm-0.24-27b"


def fleet(profile: str = "cost") -> tuple[Settings, dict[str, SimConfig]]:
    """The default workstation with vLLM 0.24, routed by ``profile``: its settings and its engines."""
    return (
        default_fleet(MODEL, profile, vllm_profile=VLLM_024),
        StackOptions(model=MODEL, vllm_profile=VLLM_024).sim_configs(),
    )


def conversation(turns: int = 3, start: int = 8000, growth: int = 2000) -> list[TraceRequest]:
    """One agent's turns (a session id), each resending the conversation and adding ``growth``."""
    out = []
    for turn in range(turns):
        tokens = start + turn * growth
        out.append(TraceRequest(turn * 2.0, "agent", MODEL, tokens, tuple(range(tokens // BLOCK + 1)), 300))
    return out


def replay(profile: str, requests: list[TraceRequest]) -> tuple[list, list[dict]]:  # type: ignore[type-arg]
    world = GatewayReplay(requests, *fleet(profile))
    results = world.run()
    decisions = run_now(world.router.store.decisions(100))
    return results, sorted(decisions, key=lambda d: int(d["request_id"].split(".")[0][1:]))


def test_the_first_turn_is_answered_on_vllm_and_the_next_finds_its_slot_warm() -> None:
    results, decisions = replay("cost", conversation())
    first, second, third = results
    assert first.backend == "vllm"
    warm = decisions[0]["warm_up"]
    assert warm is not None
    assert warm["backend"] == "llama"
    assert (second.backend, decisions[1]["slot"]) == ("llama", warm["slot"])
    # the warm-up's prompt, reused: all but its last checkpoint gap (a turn replayed from hashed
    # blocks rewrites the previous prompt's last tokens, where its chat template closed)
    gap = fleet()[1]["llama"].engine_profile.prefill.checkpoint_gap
    assert second.cached_tokens >= first.prompt_tokens - gap
    assert third.backend == "llama"
    assert third.cached_tokens >= second.prompt_tokens - gap


def test_warming_beats_the_cold_first_turn_it_replaces() -> None:
    """Without warm-ups the same session starts cold on llama.cpp (its look-ahead says its slot will
    pay): its first TTFT is the whole cold prefill; with them, vLLM's, and the rest as warm."""
    warmed, _ = replay("cost", conversation())
    world = GatewayReplay(conversation(), *fleet())
    world.router.profile = replace(world.router.profile, warms=False)
    cold = world.run()
    assert cold[0].backend == "llama"
    assert cold[0].cached_tokens == 0
    assert warmed[0].ttft_s is not None
    assert cold[0].ttft_s is not None
    assert warmed[0].ttft_s < cold[0].ttft_s / 2
    assert sum(r.ttft_s or 0 for r in warmed) < sum(r.ttft_s or 0 for r in cold)


def test_the_published_routers_never_warm() -> None:
    _, decisions = replay("dynamo-kv", conversation())
    assert all(d["warm_up"] is None for d in decisions)


def test_a_warm_up_is_in_flight_on_the_engine_as_any_request() -> None:
    """The llama.cpp engine model ran it: one more task than the requests it answered, and the
    slot's prompt came from it (the served requests there reused it)."""
    requests = conversation(turns=2)
    world = GatewayReplay(requests, *fleet())
    results = world.run()
    answered = sum(1 for r in results if r.backend == "llama")
    assert world.engines["llama"].n_tasks == answered + 1
    assert not world.fleet.load()  # nothing left in flight: the warm-up ended too


def test_an_agents_call_is_routed_by_its_last_token() -> None:
    """A trace's agent call (``"agent": true``) is sent with ``x-turnout-wait-for: last-token``: the
    decision compares the candidates' times to the last token and says why; a chat request keeps
    the first token."""
    agent = dataclasses.replace(conversation(turns=1)[0], agent=True)
    chat = TraceRequest(5.0, None, MODEL, 3000, tuple(range(900, 906)), 64)
    _, decisions = replay("cost", [agent, chat])
    assert [(d["objective"], d["objective_why"]) for d in decisions] == [
        ("last-token", "the client's x-turnout-wait-for header"),
        ("first-token", None),
    ]
    assert decisions[0]["reason"].startswith(("lowest-predicted-completion", "only-candidate"))
    assert parse_turnout(agent.to_json(), "line 1") == agent  # "agent": true round-trips
