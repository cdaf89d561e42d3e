"""The dense ``qwen35`` generator of the GPU benchmark (``bench/gpu/gguf_dense.py``, issue #63).

Its 27B shape is only sized here (a dry run: ~26.9 B parameters, F16 as heavy as vLLM's bf16 model of
``bench/gpu/vllm_model.py``); its tiny shape is written in each format and served by the real CPU
llama-server, with the padded vocabulary, as the benchmark serves the 27B on a GPU.
"""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

import httpx
import pytest

from tests.real.build_llama_server import ensure_sdist
from tests.real.llama_server import LlamaServer

pytestmark = [pytest.mark.real_llama, pytest.mark.timeout(300)]

SCRIPT = Path(__file__).resolve().parents[2] / "bench" / "gpu" / "gguf_dense.py"
FTYPES = {"f16": "F16", "q8_0": "Q8_0", "q4_0": "Q4_0"}


def run(*args: str) -> str:
    command = [sys.executable, str(SCRIPT), *args, "--llama-tree", str(ensure_sdist() / "llama.cpp")]
    result = subprocess.run(command, capture_output=True, text=True, timeout=120, check=False)
    assert result.returncode == 0, result.stdout + result.stderr
    return result.stdout


def test_the_27b_shape_weighs_what_vllms_bf16_model_does() -> None:
    sizes = {}
    for fmt in FTYPES:
        out = run("/nonexistent/27b.gguf", "--shape", "27b", "--format", fmt, "--dry-run")
        params = float(re.search(r"params ([\d.]+) B", out).group(1))  # type: ignore[union-attr]
        sizes[fmt] = float(re.search(r"tensor data ([\d.]+) GB", out).group(1))  # type: ignore[union-attr]
        assert 26.5 < params < 27.5, out
        assert "vocab 248320 (151936 + padding)" in out
        assert "64 (48 Gated DeltaNet + 16 attention)" in out
    # bench/gpu/vllm_model.py's bf16 weights: 53.8 GB (bench/gpu/results/2026-12-06-h100-vllm/model.log)
    assert abs(sizes["f16"] - 53.8) < 0.3
    assert sizes["q8_0"] == pytest.approx(sizes["f16"] * 34 / 64, rel=0.01)
    assert sizes["q4_0"] == pytest.approx(sizes["f16"] * 18 / 64, rel=0.01)


@pytest.mark.parametrize("fmt", sorted(FTYPES))
def test_llama_server_serves_the_tiny_dense_model(llama_binary: Path, tmp_path: Path, fmt: str) -> None:
    model = tmp_path / f"tiny-{fmt}.gguf"
    run(str(model), "--shape", "tiny", "--format", fmt, "--threads", "1")
    log_path = tmp_path / "llama-server.log"
    with (
        LlamaServer(
            llama_binary, model, log_path=log_path, alias="tiny-dense", extra_args=["-lv", "4"]
        ) as server,
        httpx.Client(base_url=server.base_url, timeout=60.0) as client,
    ):
        [entry] = client.get("/v1/models").json()["data"]
        assert entry["meta"]["n_vocab"] == 152_064  # the padded vocabulary
        assert entry["meta"]["ftype"] == FTYPES[fmt]
        body = {"prompt": "The quick brown fox", "n_predict": 8, "ignore_eos": True}
        response = client.post("/completion", json=body)
        assert response.status_code == 200, response.text
        answer = response.json()
        assert answer["tokens_predicted"] == 8
        assert answer["content"]
    log = log_path.read_text(errors="replace")
    assert re.search(r"print_info: arch\s+= qwen35$", log, re.MULTILINE), log[-3000:]
    assert re.search(r"print_info: n_layer\s+= 4$", log, re.MULTILINE)
