"""Crowded llama-servers in the virtual replay (``policies.homes``): 32 agents on 8 llama-servers of 2
slots, as contention-32-8llama. A turn that would wait is sent with no slot named, and a session stays
on its server unless a move evens the load; the decision log says both. Without either rule the
decisions below name a slot for every session's turn and record no ``session-stays-home``."""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

import pytest

from gateway.replay.fleets import fleet_from_file, sim_configs
from gateway.replay.generate import contention_trace
from gateway.replay.virtual import GatewayReplay, run_now

MODEL = "replay"
FLEET = Path(__file__).resolve().parents[2] / "bench" / "fleets" / "eight-llama.toml"


@pytest.fixture(scope="module")
def replayed() -> tuple[list[Any], list[dict[str, Any]]]:
    requests = contention_trace(agents=32, turns=4, seed=3, model=MODEL, oneshot_every=0.0)
    settings = fleet_from_file(FLEET, "cost")
    world = GatewayReplay(requests, settings, sim_configs(settings, MODEL))
    results = world.run()
    decisions = run_now(world.router.store.decisions(len(requests)))
    order = {f"r{i}": i for i in range(len(requests))}
    decisions.sort(key=lambda d: order[d["request_id"].split(".")[0]])
    return results, decisions


def test_every_request_is_answered(replayed: tuple[list[Any], list[dict[str, Any]]]) -> None:
    results, decisions = replayed
    assert all(r.ok for r in results)
    assert len(decisions) == len(results)


def test_turns_that_would_wait_name_no_slot(replayed: tuple[list[Any], list[dict[str, Any]]]) -> None:
    _, decisions = replayed
    unnamed = [d for d in decisions if d["slot"] is None]
    assert len(unnamed) > len(decisions) // 4  # 4 sessions a server, 2 slots: most turns wait
    chosen = [next(c for c in d["candidates"] if c["backend"] == d["chosen"]) for d in unnamed]
    assert all("for the first slot to free (no slot named: " in c["note"] for c in chosen)
    later = [d for d in decisions[len(decisions) // 2 :] if d["slot"] is not None]
    assert all(
        "waits" not in next(c for c in d["candidates"] if c["backend"] == d["chosen"])["note"] for d in later
    )  # once every server is crowded, a slot is named only to start now


def test_sessions_stay_on_their_server_and_the_log_says_why(
    replayed: tuple[list[Any], list[dict[str, Any]]],
) -> None:
    _, decisions = replayed
    stays = [r for d in decisions for r in d["rejected"] if r["reason"] == "session-stays-home"]
    assert stays
    assert all("the session stays on llama-" in r["detail"] for r in stays)
    homes: dict[str, str] = {}
    moves = 0
    for decision in decisions:
        session, backend = decision["session"], decision["chosen"]
        moves += session in homes and homes[session] != backend
        homes[session] = backend
    assert moves <= len(decisions) // 20  # only to even the load
    for rejection in stays:  # each says the move would leave the other server fuller a slot
        stays_n, slots, there, slots_there = map(
            int,
            re.findall(
                r"\((\d+) sessions for its (\d+) slots\): "
                r"llama-\d+ has (\d+) for (\d+)",
                rejection["detail"],
            )[0],
        )
        assert (there + 1) / slots_there > (stays_n - 1) / slots
