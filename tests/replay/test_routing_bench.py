"""bench/routing.py replays the draws it is told (``--draws``) and names them by their own numbers."""

from __future__ import annotations

import argparse
import dataclasses
import json
from pathlib import Path

import pytest

from tests.replay.bench_scripts import bench_scripts

routing, routing_bounds, routing_peers, routing_report, routing_validation = bench_scripts(
    "routing", "routing_bounds", "routing_peers", "routing_report", "routing_validation"
)


def test_draw_range_reads_a_span_or_a_count() -> None:
    assert routing.draw_range("32-127") == range(32, 128)
    assert routing.draw_range("8") == range(8)
    for bad in ("", "a-b", "5-3", "0", "-3"):
        with pytest.raises(argparse.ArgumentTypeError):
            routing.draw_range(bad)


def test_quick_takes_no_draws(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as exit_:
        routing.main(["--quick", "--draws", "32-40"])
    assert exit_.value.code == 2
    assert "--quick replays one smaller draw" in capsys.readouterr().err


def test_other_draws_never_overwrite_the_benchmarks_page(
    capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    """Neither a run of other draws nor a saved run of them re-rendered goes to docs/benchmarks.md
    unless ``--out`` names it."""
    saved = tmp_path / "oos.json"
    saved.write_text(json.dumps({"chat": {"meta": {"draws": 96, "first_draw": 32}}}), encoding="utf-8")
    for argv in (["--draws", "32-40", "--only", "chat"], ["--from-json", str(saved)]):
        with pytest.raises(SystemExit) as exit_:
            routing.main(argv)
        assert exit_.value.code == 2
        assert "rows over draws other than 0-31 need --out" in capsys.readouterr().err
    with pytest.raises(SystemExit):
        routing.main(["--from-json", str(saved), "--draws", "32-40", "--out", str(tmp_path / "x.md")])
    assert "--draws with --from-json replays only the --only rows" in capsys.readouterr().err


def test_per_draw_lines_name_draws_by_their_own_numbers() -> None:
    ratios = [1.0, 1.2, 0.9, 1.15]
    peer = routing_peers.peer_seed_target(ratios, first=32)
    assert "worst 1.20x (draw 33;" in peer
    assert "MISSED; above it: 33 (1.20x), 35 (1.15x)" in peer
    assert "(draw 33)" in routing_report.seed_target(ratios, first=32)
    assert "draw 1;" in routing_peers.peer_seed_target(ratios)


def test_a_row_pools_the_draws_it_was_given() -> None:
    workload = next(w for w in routing.WORKLOADS if w.name == "contention-1")
    out = routing.run(workload, quick=False, jobs=1, draws=range(40, 42))
    meta = out["meta"]
    assert (meta["draws"], meta["first_draw"]) == (2, 40)
    assert len(out["seeds"]) == len(out["peer_seeds"]) == 2
    assert meta["requests"] == sum(len(workload.seeded(seed)) for seed in (40, 41))
    text = routing_report.markdown({"contention-1": out}, False)
    assert "over 2 draws (40-41, pooled" in text
    assert "pools 2 draws of it" in text


def test_a_row_is_judged_on_what_its_clients_wait_for() -> None:
    """Agents' calls alone: the last token; none: the TTFT; a mix: each request by its own clock
    (``awaited_*``), unless the report predates those keys (then by the majority, as before)."""
    assert routing_peers.judged_on(1.0)[:2] == ("completion_mean_s", "completion_p90_s")
    assert routing_peers.judged_on(0.0)[:2] == ("ttft_mean_s", "ttft_p90_s")
    for share in (0.2252, 0.5, 0.942):
        assert routing_peers.judged_on(share)[:2] == ("awaited_mean_s", "awaited_p90_s")
    assert routing_peers.judged_on(0.942, awaited=False)[:2] == ("completion_mean_s", "completion_p90_s")
    assert routing_peers.judged_on(0.2252, awaited=False)[:2] == ("ttft_mean_s", "ttft_p90_s")
    # a mixed row where cost is slower to the first token but its agents finish first
    profiles = {
        "cost": {"ttft_mean_s": 0.37, "ttft_p90_s": 1.2, "awaited_mean_s": 1.0, "awaited_p90_s": 3.0},
        "llm-d": {"requests": 9, "ttft_mean_s": 0.24, "ttft_p90_s": 0.6, "awaited_mean_s": 1.4,
                  "awaited_p90_s": 4.0},
    }  # fmt: skip
    (line,) = routing_peers.peer_targets("mixed", profiles, homogeneous=False, agent_share=0.3)
    assert "mean wait (agents' calls: last token, the rest: TTFT)" in line
    assert "cost mean 1.000 s = 0.71x its 1.400 s (<= 0.8x), p90 3.000 s vs 4.000 s (no worse): MET" in line


def test_the_agent_rows_miss_says_what_no_router_can_reach() -> None:
    """Where ``cost`` misses 0.8x the best peer on the agent row, judged on the first token (a report
    from before issue #61), the Targets say what every turn warm on its own slot would average (the
    engines' rules), and that nothing reaches 0.8x below it."""

    def row(cost_s: float, peer_s: float) -> dict[str, dict[str, float]]:
        return {"cost": {"ttft_mean_s": cost_s}, "llm-d": {"requests": 60, "ttft_mean_s": peer_s}}

    (line,) = routing_report.peer_bound("agent", row(0.853, 0.858), quick=True)
    bound = routing_bounds.warm_turn_best(routing_bounds.agent_trace(True), min_tokens=0)
    assert bound is not None
    assert bound > 0.8 * 0.858
    assert line.startswith("  - no router reaches 0.8x here on the TTFT")
    assert f"averages {bound:.3f} s" in line
    assert routing_report.peer_bound("agent", row(0.853, 2.0), quick=True) == []  # met: nothing to explain
    (reachable,) = routing_report.peer_bound("agent", row(5.0, 4.0), quick=True)
    assert reachable.startswith("  - a router could reach 0.8x here")


def test_the_agent_rows_miss_on_the_last_token_says_what_no_router_can_reach() -> None:
    """The agent row is judged on the time to the last token (issue #61), and so is its floor: every
    turn alone and warm on the engine that ends it first, its answer decoded at batch 1. It lies
    between the first-token floor plus the shortest answer's decode and every replayed profile's mean
    (none of them beats it), and the line compares it with the best peer's last token, not its TTFT."""
    trace = routing_bounds.agent_trace(True)
    bound = routing_bounds.last_token_best(trace)
    ttft = routing_bounds.warm_turn_best(trace, min_tokens=0)
    assert bound is not None
    assert ttft is not None
    assert bound > ttft
    answers = [r.max_tokens for r in trace]
    assert bound > min(answers) / 109.0  # no decode faster than llama.cpp's 109 tok/s at batch 1

    def row(cost_s: float, peer_s: float) -> dict[str, dict[str, float]]:
        return {
            "cost": {"ttft_mean_s": 0.1, "completion_mean_s": cost_s},
            "dynamo-kv": {"requests": 60, "ttft_mean_s": 0.1, "completion_mean_s": peer_s},
        }

    (line,) = routing_report.peer_bound("agent", row(bound * 1.3, bound * 1.2), quick=True, agent_share=1.0)
    assert line.startswith("  - no router reaches 0.8x here on the time to the last token")
    assert f"averages {bound:.3f} s = 0.83x the best peer's" in line
    assert "cost is 1.30x that" in line
    (reachable,) = routing_report.peer_bound("agent", row(bound * 3, bound * 2), quick=True, agent_share=1.0)
    assert reachable.startswith("  - a router could reach 0.8x here")
    assert routing_report.peer_bound("agent", row(bound, bound * 2), quick=True, agent_share=1.0) == []


def test_a_mixed_rows_miss_says_what_no_router_can_reach_on_what_its_clients_wait_for() -> None:
    """A contention row is judged on each request's own clock (an agent's call by its last token, a
    one-off by its first): its floor pools each request's, alone and warm, over the row's draws; a
    row on another fleet (fleet-16) or a recorded trace paced to a load (mooncake) has none."""
    trace = routing_bounds.with_model(
        next(w for w in routing.WORKLOADS if w.name == "contention-1").make(True), "m"
    )
    floors = routing_bounds.alone_best(trace)
    assert {agent for _, _, agent in floors} == {True, False}
    assert all(0 < ttft <= last for ttft, last, _ in floors)
    bound = routing_bounds.floor("contention-1", "awaited_mean_s", True, range(1))
    assert bound is not None
    assert bound == pytest.approx(sum(last if agent else ttft for ttft, last, agent in floors) / len(floors))
    profiles = {
        "cost": {"ttft_mean_s": 0.1, "awaited_mean_s": bound * 1.1},
        "dynamo-kv": {"requests": 9, "ttft_mean_s": 0.1, "awaited_mean_s": bound * 1.2},
    }
    (line,) = routing_report.peer_bound("contention-1", profiles, quick=True, agent_share=0.3)
    assert line.startswith("  - no router reaches 0.8x here on the wait (agents' calls: last token")
    assert f"averages {bound:.3f} s" in line
    assert routing_bounds.floor("fleet-16", "awaited_mean_s", True, range(1)) is None
    assert routing_bounds.floor("mooncake", "ttft_mean_s", True, range(1)) is None


def test_the_agent_rows_last_token_floor_is_below_every_replayed_profile() -> None:
    """The floor is a floor: on the quick agent row replayed in virtual time, no profile (cost, the
    peers, the oracle) ends its turns sooner on average."""
    result = routing.run(routing.WORKLOADS[0], quick=True)
    bound = routing_bounds.last_token_best(routing_bounds.agent_trace(True))
    assert bound is not None
    means = {
        name: p["completion_mean_s"] for name, p in result["profiles"].items() if p.get("completion_mean_s")
    }
    assert len(means) >= 10
    assert all(mean >= bound for mean in means.values()), (bound, means)


def test_the_validation_set_runs_apart_and_prints_its_targets(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    """``--validation`` replays the validation rows (never the benchmark's) into their own page, with
    cost against the best peer on mean (0.9x) and p90. Here one row, ``--quick`` (a few requests)."""
    names = [w.name for w in routing.VALIDATION]
    assert names == [
        "val-copilot", "val-burst", "val-burst-70", "val-copilot-burst", "val-mooncake-synthetic"
    ]  # fmt: skip
    assert not set(names) & {w.name for w in routing.WORKLOADS}
    monkeypatch.setattr(routing, "VALIDATION", routing.VALIDATION[1:2])
    out = tmp_path / "validation.md"
    assert routing.main(["--validation", "--quick", "--jobs", "1", "--out", str(out)]) == 0
    text = out.read_text(encoding="utf-8")
    assert text.startswith("# Validation set")
    assert "## val-burst" in text
    assert "- val-burst: cost mean TTFT" in text
    assert "## chat" not in text
    printed = capsys.readouterr().out
    assert "the best peer's" in printed
    assert "(no worse):" in printed
    with pytest.raises(SystemExit) as exit_:
        routing.main(["--validation", "--only", "chat"])
    assert exit_.value.code == 2
    assert "it takes no --only or --from-json" in capsys.readouterr().err


def test_the_public_validation_row_replays_at_its_loads(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """val-mooncake-synthetic (the issue's unseen trace) is drawn at 8 loads from 66% to 74% of the
    fleet's prefill capacity (mean 70%), cost beside a published router; ``--quick``: its first 300
    requests at draw 4's load (71%)."""
    (row,) = [w for w in routing.VALIDATION if w.name == "val-mooncake-synthetic"]
    assert row.draws == routing_validation.SYNTHETIC_DRAWS == 8
    loads = [routing_validation.synthetic_load(k) for k in range(8)]
    assert loads[0] == pytest.approx(0.66)
    assert loads[-1] == pytest.approx(0.74)
    assert sum(loads) / 8 == pytest.approx(0.7)
    with pytest.raises(ValueError, match="draws 0-7"):
        routing_validation.synthetic_load(8)
    slow, fast = row.seeded(0), row.seeded(7)  # type: ignore[misc]
    assert len(slow) == len(fast) == 3993
    assert max(r.t for r in fast) == pytest.approx(max(r.t for r in slow) * 0.66 / 0.74, rel=1e-6)
    monkeypatch.setattr(routing, "VALIDATION", (dataclasses.replace(row, profiles=("cost", "llm-d")),))
    out = tmp_path / "validation.md"
    assert routing.main(["--validation", "--quick", "--jobs", "1", "--out", str(out)]) == 0
    text = out.read_text(encoding="utf-8")
    assert "## val-mooncake-synthetic" in text
    assert "at 8 loads from 66% to 74% of the fleet's prefill capacity" in text
    assert "- val-mooncake-synthetic: cost mean TTFT" in text


def test_cost_only_judges_a_change_on_every_validation_row(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    """``--validation --cost-only`` replays cost alone over each row's draws and prints, per row, the
    pooled mean and p90 a routing change's commit quotes; without --validation it is refused."""
    small = (
        dataclasses.replace(routing.VALIDATION[1], seeded=lambda seed: routing_validation._burst(seed)[:30]),
    )
    monkeypatch.setattr(routing, "VALIDATION", small)
    out = tmp_path / "check.json"
    assert (
        routing.main(["--validation", "--cost-only", "--draws", "2", "--jobs", "1", "--json", str(out)]) == 0
    )
    printed = capsys.readouterr().out
    assert printed.startswith("val-burst: cost mean ")
    assert "(60 requests, 2 draws)" in printed
    row = json.loads(out.read_text(encoding="utf-8"))["val-burst"]
    assert 0 < row["ttft_mean_s"] <= row["ttft_p90_s"] * 2
    with pytest.raises(SystemExit) as exit_:
        routing.main(["--cost-only"])
    assert exit_.value.code == 2
    assert "it needs --validation" in capsys.readouterr().err
