"""The random-weight ``qwen35moe`` generator of the GPU benchmark (``bench/gpu/gguf_moe.py``).

Its full shape is only sized here (a dry run of the tensor list: ~80 B parameters, ~45 GB); its
tiny shape is generated and served by a real CPU llama-server with the experts kept on the CPU
(``--cpu-moe``), as the benchmark serves the full one on a GPU.
"""

from __future__ import annotations

import importlib.util
import re
import subprocess
import sys
from pathlib import Path
from types import ModuleType

import httpx
import pytest

from tests.real.build_llama_server import ensure_sdist
from tests.real.llama_server import LlamaServer

pytestmark = [pytest.mark.real_llama, pytest.mark.timeout(300)]

SCRIPT = Path(__file__).resolve().parents[2] / "bench" / "gpu" / "gguf_moe.py"
LAYOUT = SCRIPT.with_name("gguf_moe_layout.py")
N_VOCAB = 151936  # ggml-vocab-qwen2.gguf
ALIAS = "tiny-qwen35moe"


def generator() -> ModuleType:
    """The script's layout (``gguf_moe_layout.py``) as a module (it is standalone, not in a package);
    the parts used here need no gguf."""
    spec = importlib.util.spec_from_file_location("gguf_moe_layout", LAYOUT)
    assert spec is not None
    assert spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # dataclasses look their module up
    spec.loader.exec_module(module)
    return module


@pytest.fixture(scope="module")
def tiny_moe(llama_binary: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    out = tmp_path_factory.mktemp("qwen35moe") / "tiny-qwen35moe.gguf"
    command = [sys.executable, str(SCRIPT), str(out), "--shape", "tiny", "--threads", "1"]
    command += ["--llama-tree", str(ensure_sdist() / "llama.cpp")]
    result = subprocess.run(command, capture_output=True, text=True, timeout=120, check=False)
    assert result.returncode == 0, result.stdout + result.stderr
    assert out.is_file()
    return out


def test_the_full_shape_is_an_80b_a3b_model() -> None:
    gen = generator()
    dims = gen.SHAPES["full"]
    summary = gen.summarize(gen.build_specs(dims, N_VOCAB), dims)
    assert 79e9 < summary.params < 81e9
    assert 44e9 < summary.data_bytes < 47e9
    assert 3.0e9 < summary.active_params - summary.embedding_params < 3.5e9
    assert summary.n_buffers < 20  # one random buffer per distinct shape, reused across layers


def test_llama_server_serves_the_tiny_moe_with_cpu_moe(
    llama_binary: Path, tiny_moe: Path, tmp_path: Path
) -> None:
    gen = generator()
    dims = gen.SHAPES["tiny"]
    summary = gen.summarize(gen.build_specs(dims, N_VOCAB), dims)
    log_path = tmp_path / "llama-server.log"
    extra = ["--cpu-moe", "-lv", "4"]
    with (
        LlamaServer(llama_binary, tiny_moe, log_path=log_path, alias=ALIAS, extra_args=extra) as server,
        httpx.Client(base_url=server.base_url, timeout=60.0) as client,
    ):
        [model] = client.get("/v1/models").json()["data"]
        assert model["id"] == ALIAS
        meta = model["meta"]
        assert meta["ftype"] == "Q4_0"
        assert meta["n_vocab"] == N_VOCAB
        assert meta["n_embd"] == dims.n_embd
        assert meta["n_params"] == summary.params
        assert meta["size"] == summary.data_bytes

        body = {"prompt": "The quick brown fox", "n_predict": 8, "ignore_eos": True}
        response = client.post("/completion", json=body)
        assert response.status_code == 200, response.text
        answer = response.json()
        assert answer["tokens_predicted"] == 8
        assert answer["content"]

    log = log_path.read_text(errors="replace")
    assert re.search(r"print_info: arch\s+= qwen35moe$", log, re.MULTILINE), log[-3000:]
    assert re.search(rf"print_info: n_expert\s+= {dims.n_expert}$", log, re.MULTILINE)
    assert re.search(rf"print_info: n_expert_used\s+= {dims.n_expert_used}$", log, re.MULTILINE)
    assert re.search(rf"print_info: n_layer\s+= {dims.n_layer}$", log, re.MULTILINE)
