"""bench/predictions.py holds each chosen candidate's prediction against what its request really got."""

from __future__ import annotations

import re
from typing import Any

import pytest

from gateway.replay.results import Result
from tests.replay.bench_scripts import bench_scripts

(predictions,) = bench_scripts("predictions")


def result(index: int, ttft_s: float, cached: int) -> Result:
    return Result(index, "s", 0.0, 0.0, "llama", ttft_s, ttft_s + 1.0, 4000, cached, 8)


def decision(index: int, queue_s: float, predicted_s: float, cached: int, source: str) -> dict[str, Any]:
    chosen = {
        "backend": "llama",
        "slot": 1,
        "queue_s": queue_s,
        "predicted_ttft_s": predicted_s,
        "expected_cached_tokens": cached,
        "cache_source": source,
    }
    other = {**chosen, "slot": 0, "predicted_ttft_s": 99.0, "expected_cached_tokens": 0}
    return {"request_id": f"r{index}.0", "chosen": "llama", "slot": 1, "candidates": [other, chosen]}


def test_the_chosen_candidate_is_held_against_its_requests_result(capsys: pytest.CaptureFixture[str]) -> None:
    decisions = [decision(0, 0.0, 3.0, 1000, "slot"), decision(1, 5.0, 4.0, 0, "none")]
    results = [result(0, 2.0, 400), result(1, 9.0, 3000)]
    predictions._against_outcomes(decisions, results)
    out = capsys.readouterr().out
    # predicted - real: +1 s and -5 s; cached +600 and -3000 (not the other slot's 99 s)
    assert "the chosen candidate, predicted - real): n 2, bias -2.000 s, mae 3.000 s" in out
    assert "cached tokens bias -1200, mae 1800" in out
    assert "predicted queue 0-0.001 s: n 1, bias +1.000 s" in out
    assert "predicted queue 3-inf s: n 1, bias -5.000 s" in out
    assert "cached from slot: n 1, bias +1.000 s, mae 1.000 s; cached tokens bias +600" in out
    assert "cached from none: n 1, bias -5.000 s, mae 5.000 s; cached tokens bias -3000" in out


def test_every_decision_of_a_replay_is_joined_to_its_result(
    capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(predictions, "configure_logging", lambda *_: None)  # global: the suite's own stays
    assert predictions.main(["contention-1", "--seed", "1", "--worst", "1"]) == 0
    out = capsys.readouterr().out
    decided = re.search(r"decisions worse than the best at that moment: \d+ of (\d+)", out)
    joined = re.search(r"against the outcome \(the chosen candidate, predicted - real\): n (\d+)", out)
    assert decided is not None, out
    assert joined is not None, out
    assert int(joined.group(1)) == int(decided.group(1)) > 0
