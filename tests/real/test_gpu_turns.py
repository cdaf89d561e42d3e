"""The GPU run's agreement script (``bench/gpu/turns.py``, issue #63) against the real CPU llama-server.

On the device it measures, per turn of an agent session and per fresh prompt, the TTFT and the time to
the last token beside turnout's predictions of both. Here it runs the same way on the tiny model, so a
change to turnout's decision log or streaming that would leave the GPU run without numbers fails here.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from tests.real.llama_server import LlamaServerFactory

pytestmark = [pytest.mark.real_llama, pytest.mark.timeout(300)]

SCRIPT = Path(__file__).resolve().parents[2] / "bench" / "gpu" / "turns.py"


def test_turns_measure_both_times_beside_turnouts_predictions(
    llama_server: LlamaServerFactory, tmp_path: Path
) -> None:
    server = llama_server(n_parallel=2, ctx_total=8192)
    out = tmp_path / "turns.json"
    command = [
        sys.executable, str(SCRIPT), "--engine", server.base_url, "--model", server.alias, "--turns", "3",
        "--first", "200", "--grow", "40", "300", "--fresh", "400", "--max-tokens", "6", "--seed", "1",
        "--warm", "20", "--out", str(out),
    ]  # fmt: skip
    result = subprocess.run(command, capture_output=True, text=True, timeout=240, check=False)
    assert result.returncode == 0, result.stdout[-2000:] + result.stderr[-2000:]
    got = json.loads(out.read_text())
    rows = got["rows"]  # the warm-up request first is not among them
    assert [(r["kind"], r.get("grow"), r.get("turn")) for r in rows] == [
        ("turn", 40, 1), ("turn", 40, 2), ("turn", 40, 3),
        ("turn", 300, 1), ("turn", 300, 2), ("turn", 300, 3),
        ("fresh", None, None),
    ]  # fmt: skip
    for row in rows:
        assert row["completion_tokens"] == 6  # ignore_eos: every answer is as long as asked
        assert 0 < row["ttft_s"] <= row["total_s"]
        assert row["predicted_ttft_s"] > 0
        assert row["predicted_total_s"] > row["predicted_ttft_s"]
    later = [r for r in rows if r["kind"] == "turn" and r["turn"] > 1]
    assert all(r["cached_tokens"] > 0 for r in later)  # each session stays on its slot and reuses it
    assert rows[0]["slot"] != rows[3]["slot"]  # two sessions, two slots
    assert rows[-1]["cached_tokens"] == 0  # a fresh prompt's words are its own
    agreement = got["agreement"]
    assert agreement["turns"]["n"] == 6
    assert agreement["fresh"]["n"] == 1
    for part in ("turns", "fresh"):
        for what in ("ttft_s", "total_s"):
            errors = agreement[part][what]
            assert 0 <= errors["median"] <= errors["worst"]
    assert '"agreement"' in result.stdout
    # the model's chars per token is the engine's own on these words, not turnout's prior (3.6)
    assert got["chars_per_token"] > 0
    assert abs(got["chars_per_token"] - 3.6) > 0.05, got["chars_per_token"]  # measured, not the prior
    assert "chars per token (the engine's tokenizer on these words)" in result.stdout
