"""Claude Code 2.1.332, configured by ``turnout agents``, through turnout to the simulators."""

from __future__ import annotations

import json
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
from tests.agents.harness import paste, run_claude
from tests.e2e.conftest import stop_stack

WINDOW_WARNING = "assumes a context window"
COMPACTION_PROMPT = b"CRITICAL: Respond with TEXT ONLY. Do NOT call any tools."
"""How Claude Code 2.1.332's summary request for a compaction begins."""


def messages(stack: AgentStack, since: int = 0) -> list[dict[str, Any]]:
    return [e for e in stack.decisions()[since:] if e["endpoint"] == "messages" and e["model"] == MODEL]


def compactions(stack: AgentStack) -> int:
    return sum(COMPACTION_PROMPT in body for body in client_requests(stack))


def test_claude_code_knows_the_window_and_keeps_one_slot(
    claude: Path, agent_home: Path, roomy: AgentStack
) -> None:
    roomy.setup("claude-code", agent_home / "claude-code")
    before = len(roomy.decisions())
    result, stderr = run_claude(claude, agent_home, "Read the README and say what this project does.")
    assert result["modelUsage"][MODEL]["contextWindow"] == 94_000  # not the 1M it assumes otherwise
    assert WINDOW_WARNING not in stderr
    for prompt in ("Now list the tests.", "And the docs, please."):
        run_claude(claude, agent_home, prompt, "--continue")
    entries = messages(roomy, before)
    assert len(entries) >= 3
    assert {e["session"] for e in entries} == {entries[0]["session"]}
    assert {e["session_source"] for e in entries} == {"agent-header"}  # X-Claude-Code-Session-Id
    assert_one_slot(entries)
    prompts = [e["outcome"]["prompt_tokens"] for e in entries]
    cached = [e["outcome"]["cached_tokens"] for e in entries]
    assert prompts == sorted(prompts)
    assert cached[-1] > 0.9 * prompts[-2]


@pytest.fixture
def small() -> Iterator[AgentStack]:
    """60,000 tokens on both engines: Claude Code's own prompt and tools are ~17k of it."""
    stack = agent_stack(60_000, 60_000)
    try:
        wait_windows(stack)
        yield AgentStack(stack)
    finally:
        stop_stack(stack)


@pytest.mark.timeout(1200)
def test_claude_code_compacts_before_the_conversation_outgrows_the_window(
    claude: Path, agent_home: Path, small: AgentStack
) -> None:
    """Told the real window (60k, 15k of output: compaction at 32k), Claude Code compacts and goes on."""
    small.setup("claude-code", agent_home / "claude-code")
    run_claude(claude, agent_home, f"A log to keep in mind:\n{paste(150)}\nSay OK.")
    for turn in range(20):
        run_claude(claude, agent_home, f"More of it, part {turn}:\n{paste(150)}", "--continue")
        if compactions(small):
            break
    prompts = [e["outcome"]["prompt_tokens"] for e in messages(small) if e["outcome"]]
    assert compactions(small) >= 1, f"no compaction; prompts {prompts}"
    assert prompts[-1] < 0.75 * max(prompts)  # the turn after it sent the compacted conversation
    assert {e["status"] for e in messages(small)} == {200}
    assert max(prompts) < 60_000
    for turn in range(2):  # and it goes on
        run_claude(claude, agent_home, f"And part {turn}:\n{paste(150)}", "--continue")


@pytest.mark.timeout(600)
def test_claude_code_recovers_from_prompt_is_too_long(
    claude: Path, agent_home: Path, small: AgentStack
) -> None:
    """An agent that believes a larger window (a stale config, an engine restarted smaller) sends more
    than fits: turnout answers Anthropic's "prompt is too long: N tokens > M maximum", and Claude Code
    compacts and resends the turn, which then succeeds."""
    settings = small.setup("claude-code", agent_home / "claude-code") / "settings.json"
    stale = json.loads(settings.read_text())
    stale["env"]["CLAUDE_CODE_MAX_CONTEXT_TOKENS"] = "200000"  # the settings' env wins over the process's
    settings.write_text(json.dumps(stale))
    run_claude(claude, agent_home, f"A log to keep in mind:\n{paste(1200)}\nSay OK.")
    for turn in range(20):
        run_claude(claude, agent_home, f"More of it, part {turn}:\n{paste(150)}", "--continue")
        if any(e["status"] == 400 for e in messages(small)):
            break
    entries = messages(small)
    refused = [e for e in entries if e["status"] == 400]
    assert refused, f"nothing was refused: {[e['outcome'] for e in entries]}"
    assert refused[0]["chosen"] is None
    assert compactions(small) >= 1
    assert entries[-1]["status"] == 200  # the resent turn
