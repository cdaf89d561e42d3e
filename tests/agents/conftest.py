"""Real coding agents (the pinned Claude Code and Codex CLI from npm) driven through turnout.

* ``codex`` / ``claude`` (session): the agent's executable, installed on first use into
  ``$TURNOUT_CACHE/agents`` by ``tests/real/agents.py``; skipped, with the reason printed, on a machine
  without Node.js >= 18.
* ``AgentStack``: a gateway over the two simulators serving ``MODEL``; ``decisions()`` reads its log.
* ``agent_home``: an empty home for one agent run, outside /tmp (Codex refuses to put its helper
  binaries under a temporary directory and says so on every run).
"""

from __future__ import annotations

import json
import shutil
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
import pytest

from backends.sim import SimConfig
from gateway.agents.configs import AGENTS, Target, from_gateway, pick
from policies import Architecture
from tests.agents.harness import installed
from tests.e2e.conftest import Stack, start_stack, stop_stack
from tests.real.agents import CLAUDE_CODE, CODEX, cache_root
from tests.servers import ADMIN

MODEL = "local-coder"


@pytest.fixture(scope="session")
def codex() -> Path:
    return installed(CODEX)


@pytest.fixture(scope="session")
def claude() -> Path:
    return installed(CLAUDE_CODE)


@pytest.fixture
def agent_home() -> Iterator[Path]:
    home = cache_root() / "agent-homes" / uuid.uuid4().hex[:12]
    (home / "work").mkdir(parents=True)
    try:
        yield home
    finally:
        shutil.rmtree(home, ignore_errors=True)


@dataclass
class AgentStack:
    stack: Stack

    @property
    def url(self) -> str:
        return self.stack.url

    def decisions(self) -> list[dict[str, Any]]:
        """The decision log, oldest first."""
        entries = httpx.get(self.url + "/admin/api/decisions", headers=ADMIN, params={"limit": 1000}).json()[
            "data"
        ]
        return list(reversed(entries))

    def setup(self, agent: str, directory: Path) -> Path:
        """``turnout agents`` for this gateway, written under ``directory``."""
        models = from_gateway(self.url)
        target = Target(self.url, "test-key", pick(models, MODEL), pick(models, MODEL))
        AGENTS[agent](target).write(directory)
        return directory


def agent_stack(vllm_window: int, llama_window: int, **over: Any) -> Stack:
    """A gateway over a vLLM simulator and a 2-slot llama.cpp simulator, both serving ``MODEL``; the
    simulated model answers in text (it would call a tool with random arguments, and answer Codex's
    compaction request with a tool call instead of the summary asked for)."""
    return start_stack(
        vllm=SimConfig(
            kind="vllm", model="up-vllm", time_scale=0.002, architecture=Architecture.HYBRID,
            context_window=vllm_window, tool_calls=False,
        ),
        llama=SimConfig(
            kind="llamacpp", model="up-llama", time_scale=0.002, slots=2, context_window=llama_window,
            tool_calls=False,
        ),
        extra_models=[
            {
                "name": MODEL,
                "architecture": "hybrid",
                "deployments": [
                    {"backend": "vllm", "upstream_name": "up-vllm"},
                    {"backend": "llama", "upstream_name": "up-llama"},
                ],
            }
        ],
        **over,
    )  # fmt: skip


def wait_windows(stack: Stack) -> None:
    """Until the probes reported both engines' windows."""
    import time

    deadline = time.monotonic() + 10
    while time.monotonic() < deadline:
        models = {m["id"]: m for m in httpx.get(stack.url + "/v1/models").json()["data"]}
        if all(b["context_window"] for b in models[MODEL]["backends"]):
            return
        time.sleep(0.05)
    raise AssertionError("the probes never reported the windows")


@pytest.fixture(scope="module")
def roomy() -> Iterator[AgentStack]:
    """Windows large enough for any agent's whole conversation: 94k on vLLM, 64k per llama.cpp slot."""
    stack = agent_stack(94_000, 65_536)
    try:
        wait_windows(stack)
        yield AgentStack(stack)
    finally:
        stop_stack(stack)


def assert_one_slot(entries: list[dict[str, Any]]) -> None:
    """An agent's turns (decision log entries) never split across llama.cpp slots: every turn served
    on llama.cpp, and the slot a turn on vLLM warmed (``policies.warm``), is one slot. Which engine
    serves each turn is this rig's: the simulators run 500x faster than the time they report, and
    the gateway measures vLLM by its wall-clock TTFT but llama.cpp by its own timings, so a streamed
    turn makes vLLM look 500x faster once measured (tests/e2e/test_routing.py checks the choice on a
    rig without that skew)."""
    slots = {e["slot"] for e in entries if e["chosen"] == "llama"}
    slots |= {e["warm_up"]["slot"] for e in entries if e.get("warm_up")}
    assert len(slots) <= 1, slots
    assert {e["chosen"] for e in entries} <= {"llama", "vllm"}


WARM_UP_FIELDS = ("max_tokens", "max_completion_tokens", "max_output_tokens")


def client_requests(stack: AgentStack) -> list[bytes]:
    """The request bodies the engines received for the agent, without turnout's own background
    warm-ups (``gateway.warming``: the same prompt, one output token, not streamed)."""
    out = []
    for tap in stack.stack.taps.values():
        for body in tap.requests:
            try:
                data = json.loads(body)
            except ValueError:
                out.append(body)
                continue
            warm = (
                isinstance(data, dict)
                and not data.get("stream")
                and any(data.get(f) == 1 for f in WARM_UP_FIELDS)
            )
            if not warm:
                out.append(body)
    return out
