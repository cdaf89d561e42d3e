"""docs/deploy.md's download step names what to download, as compose and the README name it (issue #60
item 9). The downloads themselves cannot run here (no internet): tests/real/test_deploy_commands.py runs
the engines' commands on files laid out as this step lays them out."""

from __future__ import annotations

import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
DEPLOY = (ROOT / "docs" / "deploy.md").read_text(encoding="utf-8")


def test_the_download_step_names_each_repository_and_file() -> None:
    assert "<its repository>" not in DEPLOY
    downloads = re.findall(r"`hf download (\S+) ([^`]*)`", DEPLOY)
    repositories = [repository for repository, _ in downloads]
    assert repositories == ["Qwen/Qwen3.8-27B-NVFP4", "unsloth/Qwen3.8-Flash-Next-GGUF"], downloads
    compose = (ROOT / "compose.yaml").read_text(encoding="utf-8")
    default = re.search(r"\$\{VLLM_MODEL:-([^}]+)\}", compose)
    assert default is not None
    assert default.group(1) == repositories[0]  # compose's default is the repository the step downloads
    folder = re.search(r"--local-dir models/(\S+)`", DEPLOY)
    assert folder is not None
    assert f"`VLLM_MODEL=/models/{folder.group(1)}`" in DEPLOY
    shard = re.search(r"`LLAMA_GGUF=(UD-Q4_K_XL/\S+-00001-of-00003\.gguf)`", DEPLOY)
    assert shard is not None  # the first shard, under the folder the --include downloads
    assert '--include "UD-Q4_K_XL/*"' in DEPLOY


def test_what_the_box_needs_is_said_in_the_steps() -> None:
    steps = DEPLOY[DEPLOY.index("## From an empty workstation") : DEPLOY.index("## The memory budget")]
    assert "128 GB of RAM" in steps
    assert "NVFP4 needs\n     Blackwell cards" in steps
    assert "Two 16 GB cards of an older generation" in DEPLOY


def test_the_demo_config_and_the_readme_say_the_same_of_its_vllm_window() -> None:
    readme = (ROOT / "README.md").read_text(encoding="utf-8")
    demo = (ROOT / "gateway" / "demo.toml").read_text(encoding="utf-8")
    assert "94k-token vLLM window, which\nneeds a 32 GB card" in readme
    assert "94k-token vLLM window that on real hardware needs a 32 GB card" in demo.replace("\n# ", " ")
    assert "context_window = 94000" in demo
