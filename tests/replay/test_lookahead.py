"""The look-ahead oracle (issue #45's stronger yardstick): its copies of the world play on exactly as
the world does, so it is never worse than the greedy oracle it starts from, and here it is better."""

from __future__ import annotations

import copy
import json
import statistics
from pathlib import Path

import pytest

from gateway.cli import main
from gateway.replay.fleets import default_fleet, sim_configs
from gateway.replay.generate import contention_trace
from gateway.replay.results import LOOKAHEAD, ORACLE, Result
from gateway.replay.traces import TraceRequest, write_trace
from gateway.replay.virtual_lookahead import LookaheadOracleReplay
from gateway.replay.virtual_oracle import OracleReplay

MODEL = "replay"
TRACE = contention_trace(agents=4, turns=5, seed=0, model=MODEL)
"""4 agents on 2 slots, 21 requests: the greedy oracle leaves a few tenths of a second here."""


def placed(results: list[Result]) -> list[tuple[str | None, float | None]]:
    return [(r.backend, r.ttft_s) for r in results]


def mean_ttft(results: list[Result]) -> float:
    return statistics.mean(r.ttft_s for r in results if r.ttft_s is not None)


class CopiedAt(OracleReplay):
    """The greedy oracle that, at request ``at``, copies itself and plays the copy to the end."""

    def __init__(self, requests: list[TraceRequest], at: int) -> None:
        super().__init__(requests, sim_configs(default_fleet(MODEL, "cost"), MODEL))
        self.at = at
        self.copy_results: list[Result] | None = None

    def send(self, index: int, request: TraceRequest, tokens: list[int]) -> None:
        if index == self.at and self.copy_results is None:
            twin = copy.deepcopy(self, {id(self.requests): self.requests})
            twin.at = -1
            twin.send(index, request, tokens)
            twin.events.run()
            self.copy_results = [twin.results[i] for i in range(len(self.requests))]
        super().send(index, request, tokens)


@pytest.mark.parametrize("at", [1, 7, 15])
def test_a_copy_of_the_world_plays_on_as_the_world_does(at: int) -> None:
    """What the look-ahead rests on: engines, queues, slots and pacing copied mid-run decide and
    measure what the world itself does (an engine driver scheduling a closure would tie the copy's
    engine to the original's)."""
    world = CopiedAt(TRACE, at)
    results = world.run()
    assert world.copy_results is not None
    assert placed(world.copy_results) == placed(results)


def test_width_one_is_the_greedy_oracle() -> None:
    fleet = sim_configs(default_fleet(MODEL, "cost"), MODEL)
    greedy = OracleReplay(TRACE, fleet).run()
    ahead = LookaheadOracleReplay(TRACE, fleet, width=1)
    assert placed(ahead.run()) == placed(greedy)
    assert ahead.rollouts == 1  # the first choice's rollout, then only its greedy continuation


def test_the_look_ahead_beats_the_greedy_oracle_where_greedy_leaves_time() -> None:
    fleet = sim_configs(default_fleet(MODEL, "cost"), MODEL)
    greedy = OracleReplay(TRACE, fleet).run()
    ahead = LookaheadOracleReplay(TRACE, fleet)
    results = ahead.run()
    assert all(r.ok for r in results)
    assert mean_ttft(results) < mean_ttft(greedy) - 0.05
    assert placed(results) != placed(greedy)
    assert ahead.rollouts > len(TRACE)  # more than one candidate tried per request


def test_the_width_must_be_positive() -> None:
    with pytest.raises(ValueError, match="width must be at least 1, not 0"):
        LookaheadOracleReplay(TRACE, sim_configs(default_fleet(MODEL, "cost"), MODEL), width=0)


def test_turnout_replay_runs_the_look_ahead_in_virtual_time_only(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    trace = tmp_path / "contention.jsonl"
    with trace.open("w") as handle:
        write_trace(TRACE, handle)
    out = tmp_path / "report.json"
    assert main(["replay", str(trace), "--lookahead", "--json", str(out)]) == 0
    profiles = json.loads(out.read_text())["profiles"]
    assert profiles[LOOKAHEAD]["ttft_mean_s"] < profiles[ORACLE]["ttft_mean_s"]
    assert main(["replay", str(trace), "--clock", "wall", "--lookahead"]) == 2
    assert "--answer-cap apply to --clock virtual only" in capsys.readouterr().err
    assert main(["replay", str(trace), "--lookahead", "--no-oracle"]) == 2
    assert "--lookahead needs the oracle (not --no-oracle)" in capsys.readouterr().err
