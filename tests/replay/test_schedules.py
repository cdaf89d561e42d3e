"""The stronger yardstick (issue #45): the best of the greedy oracle's schedule and N sampled
hindsight schedules (``SampledOracleReplay``), never worse than the oracle, the same on every run."""

from __future__ import annotations

import json
import statistics
from pathlib import Path

import pytest

from gateway.cli import main
from gateway.replay.fleets import default_fleet, sim_configs
from gateway.replay.generate import mixed_trace
from gateway.replay.results import BEST_SCHEDULE, ORACLE, Result
from gateway.replay.simulate import simulate
from gateway.replay.traces import write_trace
from gateway.replay.virtual_oracle import OracleReplay, SampledOracleReplay
from gateway.replay.virtual_world import VirtualOptions

MODEL = "replay"
TRACE = mixed_trace(agents=2, turns=5, requests=20, duration=30.0, seed=4, max_context=20_000, model=MODEL)


def mean_ttft(results: list[Result]) -> float:
    return statistics.mean(r.ttft_s for r in results if r.ttft_s is not None)


def test_a_cold_sample_is_the_greedy_oracle() -> None:
    configs = sim_configs(default_fleet(MODEL, "cost"), MODEL)
    greedy = OracleReplay(TRACE, configs).run()
    cold = SampledOracleReplay(TRACE, configs, seed=3, temperature=1e-9).run()
    assert [(r.backend, r.ttft_s) for r in cold] == [(r.backend, r.ttft_s) for r in greedy]


def test_samples_stray_from_the_greedy_schedule() -> None:
    configs = sim_configs(default_fleet(MODEL, "cost"), MODEL)
    greedy = [r.backend for r in OracleReplay(TRACE, configs).run()]
    sampled = [[r.backend for r in SampledOracleReplay(TRACE, configs, seed=s).run()] for s in (1, 2, 3)]
    assert any(run != greedy for run in sampled)


def test_the_best_schedule_is_at_or_below_the_oracle_and_reproducible() -> None:
    def run() -> dict[str, list[Result]]:
        settings_for = lambda profile: default_fleet(MODEL, profile)  # noqa: E731
        return simulate(TRACE, ["cost"], settings_for, MODEL, VirtualOptions(), schedules=4).runs

    first, second = run(), run()
    assert set(first) == {"cost", ORACLE, BEST_SCHEDULE}  # the sampled runs fold into one
    assert mean_ttft(first[BEST_SCHEDULE]) <= mean_ttft(first[ORACLE])
    assert [r.ttft_s for r in first[BEST_SCHEDULE]] == [r.ttft_s for r in second[BEST_SCHEDULE]]


def test_turnout_replay_reports_the_best_schedule_in_virtual_time_only(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    trace = tmp_path / "mixed.jsonl"
    with trace.open("w") as handle:
        write_trace(TRACE, handle)
    out = tmp_path / "report.json"
    assert main(["replay", str(trace), "--schedules", "2", "--json", str(out)]) == 0
    assert BEST_SCHEDULE in json.loads(out.read_text())["profiles"]
    assert main(["replay", str(trace), "--clock", "wall", "--schedules", "2"]) == 2
    assert (
        "--schedules, --lookahead and --answer-cap apply to --clock virtual only" in capsys.readouterr().err
    )
