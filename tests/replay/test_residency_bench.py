"""bench/residency.py: what switching the workstation's GPUs could win (issue #62, item 4). Its fleets
place each model where a static choice puts it, and its hindsight schedule holds a phase's requests
until the switch before it has ended."""

from __future__ import annotations

import json
from dataclasses import replace
from pathlib import Path

import pytest

from tests.replay.bench_scripts import bench_scripts

(residency,) = bench_scripts("residency")

from gateway.replay.generate import agent_trace  # noqa: E402


def test_each_static_choice_serves_what_holds_the_cards() -> None:
    on_vllm = residency.fleet("vllm")
    assert {d.backend for m in on_vllm.models for d in m.deployments} == {"vllm", "llama-moe"}
    flash = residency.fleet("flash-gpu")
    assert [m.name for m in flash.models] == [
        residency.LARGE
    ]  # the 27B has no home while Flash-Next holds them
    trace = agent_trace(agents=1, turns=2, model=residency.SMALL, start_tokens=1000, max_context=2000)
    assert residency.replay(trace, "flash-gpu") is None
    assert residency.summary(None, trace) == {"served": False}


def test_a_phase_after_a_switch_waits_for_the_drain_and_the_switch() -> None:
    """The second phase arrives while the first still runs: it waits for the first's last answer, then
    the free and wake seconds, and not a moment less."""
    first = agent_trace(agents=1, turns=2, seed=3, model=residency.SMALL, start_tokens=1000, max_context=2000)
    second = [
        replace(r, t=r.t + 0.5)
        for r in agent_trace(
            agents=1, turns=2, seed=4, model=residency.LARGE, start_tokens=1000, max_context=2000
        )
    ]
    parts = [("a", first), ("b", second)]
    out = residency.hindsight(parts, {"a": "vllm", "b": "flash-gpu"})
    assert (out["switches"], out["requests"]) == (1, 4)
    took = residency.SWITCH_S["vllm"][0] + residency.SWITCH_S["flash-gpu"][1]
    assert out["switching_s"] == pytest.approx(took)
    plain = [
        r.ttft_s or 0.0
        for trace, static in ((first, "vllm"), (second, "flash-gpu"))
        for r in residency.replay(trace, static) or []
    ]
    # b's first request arrived before a had ended: it waited at least the switch, on top of its TTFT
    assert out["ttft_mean_s"] >= sum(plain) / len(plain) + took / len(plain) - 1e-3


def test_the_benchmark_prints_each_phase_against_every_static_choice(tmp_path: Path) -> None:
    out = tmp_path / "residency.json"
    assert residency.main(["--json", str(out)]) == 0
    data = json.loads(out.read_text())
    assert set(data["phases"]) == {
        *("agent-27b", "chat-27b", "flash-next", "both", "alternating"),
        *("val-alternating-7", "val-alternating-8"),  # the validation traces, kept apart
    }
    for phase, rows in data["phases"].items():
        assert set(residency.STATICS) <= set(rows), phase
        assert rows["vllm"]["served"], phase  # vLLM holding the cards serves both models
    hind = data["phases"]["alternating"]["switching (hindsight)"]
    assert hind["requests"] == data["phases"]["alternating"]["vllm"]["requests"]  # none lost
    assert hind["switches"] == 3  # agent-27b, flash-next, agent-27b, flash-next: a switch at each change
    auto = data["phases"]["alternating"]["automatic"]
    assert auto["requests"] == hind["requests"]
    assert len(auto["decisions"]) <= 3  # no flapping: at most one switch per phase change
    for phase in ("agent-27b", "chat-27b", "both"):  # the 27B asked for: the cards stay with vLLM
        assert data["phases"][phase]["automatic"]["switches"] == 0, phase


def test_the_automatic_policy_decides_from_what_has_arrived_and_moves_back_for_the_27b() -> None:
    """Online: it switches to Flash-Next's member only after Flash-Next requests have arrived, and back
    to vLLM at the first 27B request (whose model would otherwise have no home)."""
    phases = residency.phase_traces()
    parts = residency.alternating(phases)
    whole = sorted((r for _, t in parts for r in t), key=lambda r: r.t)
    out = residency.automatic(whole, "vllm")
    starts = {index: trace[0].t for index, (_, trace) in enumerate(parts)}
    decisions = out["decisions"]
    assert [m for _, m in decisions] == ["flash-gpu", "vllm", "flash-gpu"]
    assert starts[1] <= decisions[0][0] < starts[2]  # after Flash-Next's first request, not before
    assert decisions[1][0] == pytest.approx(starts[2], abs=0.1)  # the 27B's first request: at once
    serialized = residency.automatic(whole, "vllm", overlap=False)
    assert serialized["decisions"] == decisions  # the same choices, priced without the overlap
    assert serialized["awaited_mean_s"] >= out["awaited_mean_s"]


def test_a_session_that_lives_through_a_switch_is_one_session() -> None:
    """The stretches before and after a switch are replayed apart; a session spanning both is still
    one session, from its first arrival to its last answer (each stretch's half alone is shorter)."""
    flash = agent_trace(agents=1, turns=6, seed=5, model=residency.LARGE, start_tokens=1000, max_context=4000)
    middle = flash[len(flash) // 2].t
    out = residency.scheduled(flash, [(middle, "flash-gpu")], "vllm")
    assert out["requests"] == len(flash)
    assert out["errors"] == 0
    assert out["session_mean_s"] >= flash[-1].t - flash[0].t  # one span across the switch
