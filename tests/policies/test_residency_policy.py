"""The automatic residency policy (policies/residency.py): homeless demand wakes its member at once, a
switch that pays is made after the minimum residence, one that does not pay is not, and no switch
leaves a model with demand homeless."""

from __future__ import annotations

from policies.engine_profile import linear_profile
from policies.residency import (
    HOMELESS,
    AutoRules,
    Demand,
    Home,
    Placement,
    decide,
    placement_work,
    switch_cost,
)

VLLM = Home("vllm", linear_profile("vllm", 6000, 35))
GGUF = Home("llama-27b", linear_profile("llamacpp", 1500, 30))
MOE = Home("llama-moe", linear_profile("llamacpp", 300, 20))
MOE_GPU = Home("llama-flash-gpu", linear_profile("llamacpp", 360, 23))
SMALL, LARGE = "27b", "flash"
PLACEMENTS = {
    "vllm": Placement("vllm", {SMALL: VLLM, LARGE: MOE}, free_s=1.0, wake_s=1.2),
    "gguf": Placement("gguf", {SMALL: GGUF, LARGE: MOE}, free_s=0.3, wake_s=3.0),
    "flash-gpu": Placement("flash-gpu", {LARGE: MOE_GPU}, free_s=0.3, wake_s=3.6),
}


def flash_agents(now: float, sessions: int = 2, turns: int = 6) -> list[Demand]:
    """Flash-Next agents over the last minute: each turn 2,000 tokens longer, 300-token answers."""
    out = []
    for turn in range(turns):
        for s in range(sessions):
            out.append(Demand(now - 58 + turn * 10 + s, LARGE, 4000 + 2000 * turn, 300, f"flash-{s}"))
    return out


def test_a_model_asked_for_and_served_by_no_awake_member_wakes_its_home_at_once() -> None:
    demand = [Demand(99.0, SMALL, 3000, 200, "agent")]
    verdict = decide(100.0, "flash-gpu", PLACEMENTS, demand, last_switch_at=95.0)  # 5 s in: no matter
    assert verdict.target == "vllm"  # vLLM serves the 27B at less work than the GGUF
    assert "27b asked for and not served by flash-gpu" in verdict.why
    assert verdict.work_s["flash-gpu"] == HOMELESS


def test_no_demand_no_switch() -> None:
    old = [Demand(10.0, LARGE, 4000, 300, "a")]  # outside the 60 s window
    assert decide(100.0, "vllm", PLACEMENTS, old, None).target is None


def test_flash_next_alone_moves_the_cards_to_it_once_the_switch_pays() -> None:
    demand = flash_agents(600.0)
    verdict = decide(600.0, "vllm", PLACEMENTS, demand, last_switch_at=None)
    assert verdict.target == "flash-gpu", verdict.why
    assert verdict.work_s["flash-gpu"] < verdict.work_s["vllm"]
    # the same demand within the minimum residence: wait
    held = decide(600.0, "vllm", PLACEMENTS, demand, last_switch_at=590.0)
    assert held.target is None
    assert "min 60 s" in held.why


def test_a_switch_that_saves_less_than_its_cost_is_not_made() -> None:
    one = [Demand(599.0, LARGE, 2000, 50, "a")]
    verdict = decide(600.0, "vllm", PLACEMENTS, one, last_switch_at=None)
    assert verdict.target is None
    assert "would save" in verdict.why
    # a wider margin refuses what the default accepts
    demand = flash_agents(600.0)
    assert decide(600.0, "vllm", PLACEMENTS, demand, None, AutoRules(margin=1e6)).target is None


def test_no_switch_leaves_a_model_with_demand_homeless() -> None:
    demand = [*flash_agents(600.0), Demand(599.0, SMALL, 2000, 100, "agent")]
    verdict = decide(600.0, "vllm", PLACEMENTS, demand, last_switch_at=None)
    assert verdict.target is None
    assert verdict.work_s["flash-gpu"] == HOMELESS


def test_work_counts_what_a_session_keeps_and_the_switch_pays_for_cold_sessions() -> None:
    turns = [Demand(0.0, LARGE, 4000, 100, "s"), Demand(10.0, LARGE, 6000, 100, "s")]
    warm = placement_work(PLACEMENTS["vllm"], turns)
    apart = placement_work(PLACEMENTS["vllm"], [turns[0], Demand(10.0, LARGE, 6000, 100, None)])
    assert warm < apart  # the second turn reuses the first's 4,100 tokens
    cost = switch_cost(PLACEMENTS["vllm"], PLACEMENTS["flash-gpu"], turns, window_s=60.0)
    assert cost >= MOE_GPU.profile.prefill_seconds(6000)  # the live session starts cold on the new member
    # nothing moves between placements that serve every model from the same backends
    assert switch_cost(PLACEMENTS["vllm"], PLACEMENTS["vllm"], turns, 60.0) == 2.2
