"""bench/routing.py replays the draws it is told (``--draws``) and names them by their own numbers."""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

import pytest

BENCH = str(Path(__file__).resolve().parents[2] / "bench")
sys.path.insert(0, BENCH)  # bench/ holds scripts, not a package
try:
    import routing
    import routing_peers
    import routing_report
finally:  # its modules must not shadow anything for the tests after this one
    while BENCH in sys.path:
        sys.path.remove(BENCH)


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


def test_the_agent_rows_miss_says_what_no_router_can_reach() -> None:
    """Where ``cost`` misses 0.8x the best peer on the agent row, the Targets say what every turn warm
    on its own slot would average (the engines' rules), and that nothing reaches 0.8x below it."""

    def row(cost_s: float, peer_s: float) -> dict[str, dict[str, float]]:
        return {"cost": {"ttft_mean_s": cost_s}, "llm-d": {"requests": 60, "ttft_mean_s": peer_s}}

    (line,) = routing_report.agent_peer_bound(row(0.853, 0.858), quick=True)
    bound = routing_report.warm_turn_best(routing_report.agent_trace(True), min_tokens=0)
    assert bound is not None
    assert bound > 0.8 * 0.858
    assert line.startswith("  - no router reaches 0.8x here")
    assert f"averages {bound:.3f} s" in line
    assert routing_report.agent_peer_bound(row(0.853, 2.0), quick=True) == []  # met: nothing to explain
    (reachable,) = routing_report.agent_peer_bound(row(5.0, 4.0), quick=True)
    assert reachable.startswith("  - a router could reach 0.8x here")


def test_the_validation_set_runs_apart_and_prints_its_targets(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    """``--validation`` replays the validation rows (never the benchmark's) into their own page, with
    cost against the best peer on mean (0.9x) and p90. Here one row, ``--quick`` (a few requests)."""
    names = [w.name for w in routing.VALIDATION]
    assert names == ["val-copilot", "val-burst", "val-burst-70", "val-copilot-burst"]
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
