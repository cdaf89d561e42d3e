"""What the router's own traffic tells of each backend (``gateway.router_views``, the fleet's own
in-flight count), and the published routers' profiles on the gateway's own path: they route every
request of a replay, from their own bookkeeping, and never pin a llama.cpp slot."""

from __future__ import annotations

import pytest

from backends.inflight import InFlight
from backends.sent import Sent
from gateway.replay.fleets import default_fleet, sim_configs
from gateway.replay.generate import agent_trace
from gateway.replay.virtual import GatewayReplay, run_now
from gateway.router_views import RouterHistory
from policies.decision import Outcome
from policies.profiles import PEER_PROFILES
from policies.types import EngineKind, Usage

MODEL = "replay"


def test_the_fleet_counts_its_own_requests_and_their_tokens_until_they_end() -> None:
    flights = InFlight()
    first = flights.begin(Sent("a", None, 0.0, prompt_tokens=1000))
    flights.begin(Sent("a", 0, 0.0, prompt_tokens=300))
    assert flights.own("a") == (2, 1300, 1300)
    flights.prefilled(first, 0.0)
    assert flights.own("a") == (2, 1300, 300)
    flights.end(first, 1.0)
    assert flights.own("a") == (1, 300, 300)
    assert flights.own("b") == (0, 0, 0)


def test_history_counts_the_last_minute_s_sends_and_keeps_latencies_as_litellm_does() -> None:
    history = RouterHistory()
    for at in (0.0, 30.0, 61.0):
        history.sent("a", at)
    answer = Outcome("a", "m", EngineKind.VLLM, Usage(100, 10, 0), 0.5, 2.0, 400, 0, True)
    for _ in range(12):
        history.answered(answer)
    flights = InFlight()

    class Own:  # what the history reads of the fleet
        own = staticmethod(flights.own)

    view = history.view(Own(), "a", 65.0)  # type: ignore[arg-type]
    assert view.sent_last_minute == 2  # 30 s and 61 s
    assert view.latency_per_token == (0.2,) * 10  # 2.0 s / 10 tokens, ten kept
    assert view.ttft_per_token == (0.05,) * 10


@pytest.mark.parametrize("profile", sorted(PEER_PROFILES))
def test_every_peer_routes_a_replay_on_its_own_bookkeeping_and_pins_no_slot(profile: str) -> None:
    requests = agent_trace(agents=3, turns=4, start_tokens=3000, max_context=9000, model=MODEL)
    settings = default_fleet(MODEL, profile)
    replay = GatewayReplay(requests, settings, sim_configs(settings, MODEL))
    results = replay.run()
    assert all(r.error is None for r in results)
    decisions = run_now(replay.router.store.decisions(len(requests)))
    assert len(decisions) == len(requests)
    assert all(entry["profile"] == profile for entry in decisions)
    assert all(entry["slot"] is None for entry in decisions)  # llama-server chose its slots
    assert replay.fleet.own("llama") == (0, 0, 0)  # every request ended
