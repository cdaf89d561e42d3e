"""bench/insample_cost.py prints ``cost``'s pooled mean and p90 on in-sample rows: what a routing change
is worked out on before the validation set judges it (docs/replay.md)."""

from __future__ import annotations

import re
import statistics

import pytest

from gateway.replay.report import percentile
from tests.replay.bench_scripts import bench_scripts

(insample_cost,) = bench_scripts("insample_cost")


def test_a_rows_draws_are_pooled_request_by_request(
    capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(insample_cost, "configure_logging", lambda *_: None)  # the suite's own stays
    assert insample_cost.main(["--only", "contention-1", "--draws", "2", "--jobs", "1"]) == 0
    out = capsys.readouterr().out
    line = re.search(r"contention-1: ttft ([\d.]+)/([\d.]+), last .* \((\d+) requests, 2 draws\)", out)
    assert line is not None, out
    ttfts = [t[0] for seed in (0, 1) for t in insample_cost._draw("contention-1", seed)]
    assert int(line.group(3)) == len(ttfts) > 0
    assert float(line.group(1)) == pytest.approx(statistics.fmean(ttfts), abs=1e-4)
    assert float(line.group(2)) == pytest.approx(percentile(ttfts, 0.9), abs=1e-4)
