"""The published routers' rules (``policies.peers``), each through ``policies.route`` with its profile:
it chooses as its source says, from what its router can see (its routing history, its own requests,
the engines' metrics, the session header), and pins no llama.cpp slot."""

from __future__ import annotations

from types import MappingProxyType

from policies import Architecture, Deployment, Endpoint, EngineKind, Health, RequestFeatures, route
from policies.context import RoutingContext
from policies.ledger import RouterView
from policies.peers import pseudo_random, ring_owner
from policies.profiles import PEER_PROFILES
from policies.types import BackendSnapshot, PrefixMatch, Reason, SessionSource, SlotState

PROMPT = 4000
NAMES = ("a", "b", "c")


def snapshot(name: str, *, queued: int = 0, kv: float | None = None, llama: bool = False) -> BackendSnapshot:
    deployment = Deployment("m", name, "m", 65536, Architecture.HYBRID)
    kind = EngineKind.LLAMACPP if llama else EngineKind.VLLM
    slots = (SlotState(0, 65536, False), SlotState(1, 65536, False)) if llama else ()
    return BackendSnapshot(
        name,
        kind,
        Health.READY,
        0.0,
        (deployment,),
        queued=queued,
        kv_usage=kv,
        slots=slots,
        total_slots=len(slots) or None,
    )


def features(*, session: str | None = None, stream: bool = False) -> RequestFeatures:
    source = SessionSource.HEADER if session else SessionSource.NONE
    return RequestFeatures(
        "m", Endpoint.CHAT, PROMPT, 64, stream=stream, session_key=session, session_source=source
    )


def choose(
    profile: str,
    snapshots: list[BackendSnapshot],
    *,
    held: dict[str, int] | None = None,
    routers: dict[str, RouterView] | None = None,
    request: RequestFeatures | None = None,
    sequence: int = 0,
) -> str:
    matches = {name: PrefixMatch(recent=tokens) for name, tokens in (held or {}).items()}
    context = RoutingContext(
        sequence=sequence, matches=MappingProxyType(matches), routers=MappingProxyType(routers or {})
    )
    decision = route(request or features(), snapshots, PEER_PROFILES[profile], 0.0, context)
    assert decision.chosen is not None
    assert decision.reason is Reason.PEER_RULE or len(snapshots) == 1
    return decision.chosen.backend_id


def test_llm_d_weighs_prefix_3_queue_2_and_kv_use_2() -> None:
    fleet = [snapshot("a", queued=5, kv=0.5), snapshot("b", kv=0.9), snapshot("c", kv=0.1)]
    # a holds half the prompt: 3 x 0.5 + 2 x 0 (the longest queue) + 2 x 0.5 = 2.5 < c's 0 + 2 + 1.8
    assert choose("llm-d", fleet, held={"a": PROMPT // 2}) == "c"
    # all of it: 3 + 0 + 1 = 4 > 3.8
    assert choose("llm-d", fleet, held={"a": PROMPT}) == "a"


def test_llm_d_breaks_ties_at_random_by_the_request_counter() -> None:
    fleet = [snapshot(name) for name in NAMES]
    chosen = {choose("llm-d", fleet, sequence=n) for n in range(12)}
    assert chosen == set(NAMES)
    assert choose("llm-d", fleet, sequence=5) == NAMES[pseudo_random(5, 3)]


def test_sglang_follows_a_match_above_30_percent_unless_its_worker_is_far_over_the_mean() -> None:
    fleet = [snapshot(name) for name in NAMES]
    loads = {"a": RouterView(in_flight=0), "b": RouterView(in_flight=3), "c": RouterView(in_flight=1)}
    assert choose("sglang-cache-aware", fleet, held={"b": 1600}, routers=loads) == "b"  # 40% > 30%
    assert choose("sglang-cache-aware", fleet, held={"b": 800}, routers=loads) == "a"  # 20%: a miss
    idle = {"a": RouterView(sent_total=5), "b": RouterView(sent_total=2), "c": RouterView(sent_total=2)}
    assert choose("sglang-cache-aware", fleet, routers=idle) == "b"  # a tie on load: fewer sent so far
    crowded = {**loads, "b": RouterView(in_flight=100)}  # > 1.5 x the mean (33.7) and > mean + 64
    assert choose("sglang-cache-aware", fleet, held={"b": 1600}, routers=crowded) == "a"


def test_dynamo_takes_the_least_prefill_plus_decode_blocks() -> None:
    fleet = [snapshot("a"), snapshot("b")]
    held = {"a": 3200}  # 200 of the prompt's 250 blocks
    busy_prefill = {"a": RouterView(in_flight=1, open_tokens=2000, prefill_tokens=2000)}
    # a: (2000 + 4000) / 16 - 200 + 2000 / 16 + 50 = 300; b: 250 + 250 = 500
    assert choose("dynamo-kv", fleet, held=held, routers=busy_prefill) == "a"
    decoding = {"a": RouterView(in_flight=4, open_tokens=8000)}  # a: 50 + 500 + 50 = 600 > 500
    assert choose("dynamo-kv", fleet, held=held, routers=decoding) == "b"


def test_the_production_stack_s_session_ring_keeps_a_session_and_moves_few_when_a_backend_goes() -> None:
    fleet = [snapshot(name) for name in NAMES]
    busy = {"a": RouterView(in_flight=50), "b": RouterView(in_flight=50), "c": RouterView(in_flight=50)}
    owner = choose("vllm-session", fleet, request=features(session="agent-7"), routers=busy)
    assert owner == NAMES[ring_owner("agent-7", NAMES)]
    keys = [f"agent-{n}" for n in range(60)]
    before = {k: NAMES[ring_owner(k, NAMES)] for k in keys}
    after = {k: ("a", "b")[ring_owner(k, ("a", "b"))] for k in keys}
    assert all(after[k] == before[k] for k in keys if before[k] != "c")  # only c's sessions move
    assert len(set(before.values())) == 3


def test_the_production_stack_without_a_session_takes_the_fewest_sends_of_the_last_minute() -> None:
    fleet = [snapshot(name) for name in NAMES]
    sends = {
        "a": RouterView(sent_last_minute=4),
        "b": RouterView(sent_last_minute=2),
        "c": RouterView(sent_last_minute=2),
    }
    assert choose("vllm-session", fleet, routers=sends) == "b"


def test_the_production_stack_s_prefix_routing_takes_the_longest_match_else_any() -> None:
    fleet = [snapshot(name) for name in NAMES]
    assert choose("vllm-prefixaware", fleet, held={"a": 1000, "c": 3000}) == "c"
    assert {choose("vllm-prefixaware", fleet, sequence=n) for n in range(12)} == set(NAMES)


def test_litellm_least_busy_takes_the_fewest_in_flight_the_first_on_a_tie() -> None:
    fleet = [snapshot(name) for name in NAMES]
    loads = {"a": RouterView(in_flight=2), "b": RouterView(in_flight=1), "c": RouterView(in_flight=1)}
    assert choose("litellm-least-busy", fleet, routers=loads) == "b"


def test_litellm_latency_tries_the_unseen_first_then_the_lowest_mean_per_output_token() -> None:
    fleet = [snapshot(name) for name in NAMES]
    seen = {
        "a": RouterView(latency_per_token=(0.02, 0.04)),
        "b": RouterView(latency_per_token=(0.05,)),
        "c": RouterView(latency_per_token=(0.01, 0.07), ttft_per_token=(0.001,)),
    }
    assert choose("litellm-latency", fleet, routers={"a": seen["a"], "b": seen["b"]}) == "c"  # never seen: 0
    assert choose("litellm-latency", fleet, routers=seen) == "a"  # 0.03 < 0.04 = c's < 0.05
    # streamed: the sum of the TTFTs per token over the number of latency samples, as LiteLLM divides
    many = RouterView(latency_per_token=(0.05,) * 10, ttft_per_token=(0.05,) * 10)  # 0.5 / 10 = 0.05
    one = RouterView(latency_per_token=(0.01,), ttft_per_token=(0.02,))  # 0.02 / 1
    assert (
        choose("litellm-latency", fleet[:2], routers={"a": many, "b": one}, request=features(stream=True))
        == "b"
    )
    assert choose("litellm-latency", fleet, routers=seen, request=features(stream=True)) == "c"  # 0.001 / 2


def test_no_peer_pins_a_llama_cpp_slot() -> None:
    fleet = [snapshot("llama", llama=True)]
    for name, profile in PEER_PROFILES.items():
        decision = route(features(session="s"), fleet, profile, 0.0, RoutingContext())
        assert decision.chosen is not None, name
        assert decision.slot is None, name
        assert decision.chosen_candidate is not None
        assert decision.chosen_candidate.estimate is not None
        assert decision.chosen_candidate.estimate.slot is not None  # the cost model would have pinned one
