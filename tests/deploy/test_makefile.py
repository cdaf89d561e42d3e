"""The two commands of the README, as make runs them: ``make demo`` installs the runtime only (a demo
needs no test or lint tools: the whole dev toolchain took 103 s cold), ``make test`` everything."""

from __future__ import annotations

import os
import subprocess

from tests.deploy.compose_run import REPO


def make(*args: str) -> str:
    """``make`` as a developer types it: outside any other make. Under ``make test`` (CI) the inherited
    MAKELEVEL/MAKEFLAGS would add "Entering directory" lines, which are not part of any recipe."""
    env = {k: v for k, v in os.environ.items() if k not in ("MAKELEVEL", "MAKEFLAGS", "MFLAGS", "MAKEFILES")}
    args_ = ["make", "--no-print-directory", *args]
    return subprocess.run(args_, cwd=REPO, env=env, capture_output=True, text=True, check=True).stdout


def recipe(target: str) -> str:
    """What ``make`` would run for ``target`` from scratch (``-B``: as on a fresh clone), unrun."""
    return make("-n", "-B", target)


def test_make_demo_installs_the_runtime_only() -> None:
    lines = recipe("demo")
    assert "pip install --quiet -e . " in lines
    assert "[dev]" not in lines
    assert "[test]" not in lines
    assert lines.rstrip().endswith(".venv/bin/turnout demo")


def test_make_test_installs_the_dev_extras() -> None:
    assert "pip install --quiet -e '.[dev]'" in recipe("test")


def test_make_help_names_the_demo_s_three_engines() -> None:
    lines = make("help")
    assert "three built-in simulated engines: vLLM and two llama.cpp" in lines
