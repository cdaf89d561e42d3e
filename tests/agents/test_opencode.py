"""OpenCode 1.18.33, configured by ``turnout agents``, through turnout to the simulators."""

from __future__ import annotations

import json
import os
import subprocess
from pathlib import Path

import pytest

from tests.agents.conftest import MODEL, AgentStack, assert_one_slot, client_requests
from tests.agents.harness import installed
from tests.real.agents import OPENCODE


@pytest.fixture(scope="session")
def opencode() -> Path:
    return installed(OPENCODE)


def run_opencode(opencode: Path, home: Path, prompt: str, *options: str) -> str:
    config = home / ".config"
    environment = {
        "PATH": os.environ["PATH"],
        "HOME": str(home),
        "XDG_CONFIG_HOME": str(config),
        "XDG_DATA_HOME": str(home / ".local" / "share"),
        "XDG_CACHE_HOME": str(home / ".cache"),
        "XDG_STATE_HOME": str(home / ".local" / "state"),
        "OPENCODE_DISABLE_MODELS_FETCH": "1",  # no models.dev: the window comes from opencode.json
        "OPENCODE_DISABLE_AUTOUPDATE": "1",
        "TURNOUT_API_KEY": "test-key",
    }
    done = subprocess.run(
        [str(opencode), "run", *options, prompt], cwd=home / "work", env=environment, capture_output=True,
        text=True, timeout=240, stdin=subprocess.DEVNULL, check=False,
    )  # fmt: skip
    assert done.returncode == 0, (
        f"opencode failed ({done.returncode}):\n{done.stdout[-3000:]}\n{done.stderr[-3000:]}"
    )
    return done.stdout


@pytest.mark.timeout(600)
def test_opencode_sends_the_output_limit_and_keeps_one_slot(
    opencode: Path, agent_home: Path, roomy: AgentStack
) -> None:
    roomy.setup("opencode", agent_home / ".config" / "opencode")
    before = len(roomy.stack.taps["llama"].requests) + len(roomy.stack.taps["vllm"].requests)
    start = len(roomy.decisions())
    run_opencode(opencode, agent_home, "Read the README and say what this project does.")
    run_opencode(opencode, agent_home, "Now list the tests.", "--continue")
    bodies = [json.loads(b) for b in client_requests(roomy)]  # not turnout's own warm-ups
    assert len(bodies) > before
    limits = {b.get("max_tokens") for b in bodies if b.get("tools")}  # the agent's turns, not its title
    assert limits == {94_000 // 4}  # limit.output from turnout agents
    turns = [e for e in roomy.decisions()[start:] if e["model"] == MODEL and e["outcome"]]
    assert {e["status"] for e in turns} == {200}
    agent_turns = [e for e in turns if e["outcome"]["prompt_tokens"] > 4000]  # titles are short
    assert len(agent_turns) >= 2
    assert_one_slot(agent_turns)
    assert agent_turns[-1]["outcome"]["cached_tokens"] > 0.8 * agent_turns[-2]["outcome"]["prompt_tokens"]
