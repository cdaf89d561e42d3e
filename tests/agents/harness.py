"""Running the pinned agents non-interactively, for the agent tests (simulators and real engines)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from tests.real.agents import Agent, cannot_install_reason, ensure


def installed(agent: Agent) -> Path:
    """The agent's executable; skips, printing why, on a machine without Node.js >= 18."""
    reason = cannot_install_reason()
    if reason is not None:
        print(f"\nskipping {agent.name} tests: {reason}", file=sys.stderr)
        pytest.skip(reason)
    return ensure(agent)  # an install that fails is an error, not a skip


def run_codex(
    codex: Path, home: Path, *args: str, timeout: float = 180, check: bool = True
) -> list[dict[str, Any]]:
    """One ``codex exec`` (non-interactive, read-only sandbox) in ``home``; its JSONL events."""
    env = {
        "PATH": os.environ["PATH"],
        "HOME": str(home),
        "CODEX_HOME": str(home / "codex"),
        "TURNOUT_API_KEY": "test-key",
        "NO_COLOR": "1",
    }
    *options, prompt = args  # a long prompt goes through stdin ("-"): one argv string holds 128 KiB
    command = [str(codex), "exec", "--skip-git-repo-check", "--json", "-s", "read-only", *options, "-"]
    done = subprocess.run(
        command, cwd=home / "work", env=env, capture_output=True, text=True, timeout=timeout,
        input=prompt, check=False,
    )  # fmt: skip
    events = [json.loads(line) for line in done.stdout.splitlines() if line.startswith("{")]
    assert done.returncode == 0 or not check, (
        f"codex failed ({done.returncode}):\n{done.stdout[-3000:]}\n{done.stderr[-3000:]}"
    )
    return events


def run_claude(
    claude: Path,
    home: Path,
    prompt: str,
    *options: str,
    env: dict[str, str] | None = None,
    timeout: float = 180,
) -> tuple[dict[str, Any], str]:
    """One ``claude -p`` in ``home`` (settings from ``home/claude-code``); its JSON result and stderr."""
    environment = {
        "PATH": os.environ["PATH"],
        "HOME": str(home),
        "TERM": "dumb",
        "CLAUDE_CONFIG_DIR": str(home / "claude-code"),
    }
    done = subprocess.run(
        [str(claude), "-p", "--output-format", "json", *options], input=prompt, cwd=home / "work",
        env=environment, capture_output=True, text=True, timeout=timeout, check=False,
    )  # fmt: skip
    assert done.returncode == 0, (
        f"claude failed ({done.returncode}):\n{done.stdout[-3000:]}\n{done.stderr[-3000:]}"
    )
    result = json.loads(done.stdout)
    assert result["subtype"] == "success", result
    return result, done.stderr


def paste(lines: int) -> str:
    return "\n".join(f"line {i}: the function returns a value from the cache" for i in range(lines))
