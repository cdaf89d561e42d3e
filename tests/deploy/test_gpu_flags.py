"""``bench/gpu/compose_flags.py``: the GPU runs serve llama-server with compose.yaml's own flags. One
GPU drops the split flags; the two-GPU run (issue #30, ``run.sh serve:split``) keeps every flag."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

from tests.deploy.test_compose import SERVICES

SCRIPT = Path(__file__).resolve().parents[2] / "bench" / "gpu" / "compose_flags.py"


def flags(*extra: str) -> list[str]:
    argv = [sys.executable, str(SCRIPT), "--model", "/m.gguf", "--port", "9999", *extra]
    return subprocess.run(argv, capture_output=True, text=True, check=True, timeout=60).stdout.split()


def pairs(argv: list[str]) -> dict[str, str | None]:
    out: dict[str, str | None] = {}
    for index, part in enumerate(argv):
        if part.startswith("--"):
            value = (
                argv[index + 1] if index + 1 < len(argv) and not argv[index + 1].startswith("--") else None
            )
            out[part] = value
    return out


def test_two_gpus_run_every_flag_of_compose() -> None:
    written = pairs([str(part) for part in SERVICES["llama"]["command"]])
    split = pairs(flags())
    assert split["--split-mode"] == "layer"
    assert split["--tensor-split"] == "1,1"
    assert (split["--model"], split["--port"], split["--host"]) == ("/m.gguf", "9999", "127.0.0.1")
    assert set(split) == set(written)  # nothing dropped, nothing added


def test_one_gpu_drops_only_the_split_flags() -> None:
    one, split = pairs(flags("--one-gpu")), pairs(flags())
    assert set(split) - set(one) == {"--split-mode", "--tensor-split"}
    pinned = pairs(flags("--one-gpu", "--set", "load-mode=none", "--set", "ubatch-size=4096"))
    assert (pinned["--load-mode"], pinned["--ubatch-size"]) == ("none", "4096")


def test_the_vllm_service_runs_as_compose_writes_it_on_one_gpu() -> None:
    """bench/gpu/vllm.sh serves vLLM with compose.yaml's command: its positional model becomes
    ``--model``, and one GPU drops only ``--tensor-parallel-size``."""
    written = [str(part) for part in SERVICES["vllm"]["command"]]
    one = pairs(flags("--service", "vllm", "--one-gpu"))
    expected = pairs(written[1:])  # the first item is vLLM's positional model
    assert set(expected) - set(one) == {"--tensor-parallel-size"}
    assert one["--model"] == "/m.gguf"
    assert all(
        one[flag] == value
        for flag, value in expected.items()
        if flag not in ("--host", "--port", "--tensor-parallel-size")
    )
    both = pairs(flags("--service", "vllm"))
    assert both["--tensor-parallel-size"] == "2"


def test_drop_leaves_a_flag_out_for_the_residency_preset() -> None:
    """``gpu8``: deploy/residency/presets.ini's Flash-Next, ``--n-cpu-moe 40`` where compose has
    ``--cpu-moe``; every other flag as written."""
    plain = flags("--one-gpu")
    gpu8 = flags("--one-gpu", "--drop", "cpu-moe", "--set", "n-cpu-moe=40")
    assert "--cpu-moe" in plain
    assert "--cpu-moe" not in gpu8
    assert gpu8[gpu8.index("--n-cpu-moe") + 1] == "40"
    assert [f for f in plain if f != "--cpu-moe"] == gpu8[: len(plain) - 1]
