"""Codex CLI 0.171.0, configured by ``turnout agents``, through turnout to the simulators.

Codex sends ``Accept-Encoding: zstd,gzip`` on every request; turnout answers uncompressed streams.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.agents.conftest import (
    MODEL,
    AgentStack,
    agent_stack,
    assert_one_slot,
    client_requests,
    wait_windows,
)
from tests.agents.harness import paste, run_codex
from tests.e2e.conftest import stop_stack

FALLBACK_WARNING = "Defaulting to fallback metadata"


def turn_completed(events: list[dict[str, Any]]) -> dict[str, Any]:
    completed = [e for e in events if e["type"] == "turn.completed"]
    assert len(completed) == 1, events
    return completed[0]


def errors(events: list[dict[str, Any]]) -> list[str]:
    return [
        e["item"]["message"]
        for e in events
        if e["type"] == "item.completed" and e["item"].get("type") == "error"
    ]


def test_codex_turns_are_one_session_on_one_slot_with_growing_cache(
    codex: Path, agent_home: Path, roomy: AgentStack
) -> None:
    roomy.setup("codex", agent_home / "codex")
    before = len(roomy.decisions())
    first = run_codex(codex, agent_home, "--strict-config", "Read the README and say what this project does.")
    assert not [m for m in errors(first) if FALLBACK_WARNING in m]  # the catalog told Codex the model
    turn_completed(first)
    for prompt in ("Now list the tests.", "And the docs, please."):
        turn_completed(run_codex(codex, agent_home, "resume", "--last", prompt))
    entries = [e for e in roomy.decisions()[before:] if e["endpoint"] == "responses"]
    assert len(entries) >= 3
    assert {e["session"] for e in entries} == {entries[0]["session"]}
    assert {e["session_source"] for e in entries} == {"agent-header"}  # Codex's session-id
    assert_one_slot(entries)  # a session that will go on takes a slot, or warms one
    cached = [e["outcome"]["cached_tokens"] for e in entries if e["outcome"]]
    prompts = [e["outcome"]["prompt_tokens"] for e in entries if e["outcome"]]
    assert prompts == sorted(prompts)
    assert cached[-1] > cached[0]
    assert cached[-1] > 0.8 * prompts[-2]


WINDOW = 40_000
COMPACTION_PROMPT = b"CONTEXT CHECKPOINT COMPACTION"
"""How Codex 0.171.0's compaction request begins its last message (a local summary, not /compact)."""


@pytest.fixture
def small() -> Iterator[AgentStack]:
    """A window Codex's conversation outgrows in a few turns: 40,000 tokens on both engines (Codex
    keeps up to ~20k tokens of user messages through a compaction, beside its ~11k of instructions)."""
    stack = agent_stack(WINDOW, WINDOW)
    try:
        wait_windows(stack)
        yield AgentStack(stack)
    finally:
        stop_stack(stack)


def prompts(stack: AgentStack) -> list[int]:
    entries = [e for e in stack.decisions() if e["endpoint"] == "responses" and e["model"] == MODEL]
    assert {e["outcome"]["status"] for e in entries if e["outcome"]} <= {200}
    return [e["outcome"]["prompt_tokens"] for e in entries if e["outcome"]]


def compactions(stack: AgentStack) -> int:
    """Codex's compaction requests the engines received."""
    return sum(COMPACTION_PROMPT in body for body in client_requests(stack))


@pytest.mark.timeout(1200)
def test_codex_compacts_before_the_conversation_outgrows_the_window(
    codex: Path, agent_home: Path, small: AgentStack
) -> None:
    """Told the real window, Codex compacts at 90% of it and goes on; no turn fails."""
    small.setup("codex", agent_home / "codex")
    turn_completed(run_codex(codex, agent_home, f"A log to keep in mind:\n{paste(60)}\nSay OK."))
    for turn in range(40):
        prompt = f"More of it, part {turn}:\n{paste(60)}"
        turn_completed(run_codex(codex, agent_home, "resume", "--last", prompt))
        if compactions(small):
            break
    sizes = prompts(small)
    assert compactions(small) == 1, f"no compaction; prompts {sizes}"
    assert max(sizes) <= 0.9 * WINDOW + 1_500  # compacted at 90%, before the window was reached
    for turn in range(3):  # and it goes on
        turn_completed(run_codex(codex, agent_home, "resume", "--last", f"And part {turn}:\n{paste(60)}"))


@pytest.mark.timeout(600)
def test_codex_recovers_from_a_turn_too_long_for_the_window(
    codex: Path, agent_home: Path, small: AgentStack
) -> None:
    """A turn that alone outgrows the window gets turnout's ``context_length_exceeded``: Codex fails
    that turn with its own message ("ran out of room"), and compacts before the next one."""
    small.setup("codex", agent_home / "codex")
    turn_completed(run_codex(codex, agent_home, "Say OK."))
    failed = run_codex(codex, agent_home, "resume", "--last", f"Read this:\n{paste(3000)}", check=False)
    assert any("ran out of room in the model's context window" in e.get("message", "") for e in failed)
    refused = [e for e in small.decisions() if e["status"] == 400 and e["model"] == MODEL]
    assert refused, "turnout never refused the turn"
    assert refused[0]["chosen"] is None
    assert refused[0]["error"].startswith("This model's maximum context length is 40000 tokens.")
    turn_completed(run_codex(codex, agent_home, "resume", "--last", "Summarise what you know so far."))
    assert compactions(small) >= 1
