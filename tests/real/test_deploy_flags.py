"""The engine flags compose.yaml uses, against the engines the tests build (``--help``)."""

from __future__ import annotations

import re
import subprocess
from pathlib import Path

import pytest

from tests.deploy.test_compose import REPO, SERVICES, flags


@pytest.mark.real_llama
def test_llama_flags_are_understood_by_the_real_llama_server(llama_binary: Path) -> None:
    help_text = subprocess.run(
        [str(llama_binary), "--help"], capture_output=True, text=True, timeout=60, check=False
    ).stdout
    known = set(re.findall(r"(?<![\w-])(--?[a-z0-9][a-z0-9-]*)", help_text))
    used = flags(SERVICES["llama"]["command"])
    assert {"--n-gpu-layers", "--cpu-moe", "--parallel", "--ctx-checkpoints", "--cache-ram", "--metrics",
            "--slots", "--alias"} <= set(used)  # fmt: skip
    assert [f for f in used if f not in known] == []


@pytest.mark.real_vllm
def test_vllm_flags_are_understood_by_the_real_vllm(vllm_python: Path) -> None:
    launcher = REPO / "tests" / "real" / "vllm_launcher.py"
    help_text = subprocess.run(
        [str(vllm_python), str(launcher), "serve", "--help=all"], capture_output=True, text=True,
        timeout=300, check=False,
    ).stdout  # fmt: skip
    known = set(re.findall(r"(?<![\w-])(--[a-z0-9][a-z0-9-]*)", help_text))
    assert SERVICES["vllm"]["entrypoint"] == ["vllm", "serve"]
    used = flags(SERVICES["vllm"]["command"])
    assert {"--tensor-parallel-size", "--served-model-name", "--enable-prompt-tokens-details",
            "--max-model-len", "--gpu-memory-utilization"} <= set(used)  # fmt: skip
    assert [f for f in used if f not in known] == []
