"""``bench/gpu/trace_costs.py`` reads llama-server's own trace (``-lv 4 --log-timestamps``, as
``bench/gpu/run.sh trace:LABEL`` keeps it) of the H100 run committed in
bench/gpu/results/2026-12-07b-h100-q8-checkpoints/: its saves, with the checkpoints each slot held, and
the checkpoints taken as prompts were processed."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
SCRIPT = REPO / "bench" / "gpu" / "trace_costs.py"
RUN = REPO / "bench" / "gpu" / "results" / "2026-12-07b-h100-q8-checkpoints"


def test_it_reads_the_saves_and_the_checkpoints_taken_from_the_servers_trace() -> None:
    logs = [RUN / "trace-turns.log", RUN / "trace-probe.log.gz", RUN / "trace-calibrate.log.gz"]
    argv = [sys.executable, str(SCRIPT), *map(str, logs)]
    out = subprocess.run(argv, capture_output=True, text=True, check=True, timeout=120).stdout
    assert out == (RUN / "trace-costs.txt").read_text()  # the numbers docs/calibrate.md quotes
    assert "saves: 33 (tokens, checkpoints held, seconds)" in out
    assert "75.7 ms + 39.29 us a token + 134.4 ms a checkpoint" in out
    assert "0-256   tokens: 188, median 125.9 ms" in out
