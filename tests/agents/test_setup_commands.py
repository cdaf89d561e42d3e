"""``turnout agents``' printed output, followed as a user follows it, then the agent answers through turnout.

The command runs against the gateway; each printed file goes where its heading says (``~`` is the
agent's home), and the ``# shell`` lines run in ``bash`` as printed, except the last one, the agent's
interactive start, which becomes its non-interactive form with a prompt (``claude -p``, ``codex exec``,
``opencode run``). The agents read their settings from their default places: nothing points them at the
files but where ``turnout agents`` said to put them. aider is not installed by the suite (a Python
application with its own pins; docs/agents.md says how it was checked), so its section is not run.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

import pytest

from tests.agents.conftest import MODEL, AgentStack
from tests.agents.harness import installed
from tests.real.agents import CLAUDE_CODE, CODEX, OPENCODE, Agent

PROMPT = "Say hello."


@dataclass(frozen=True)
class Section:
    files: dict[str, str]  # path as printed (~/...) -> content
    shell: list[str]


def sections(output: str) -> dict[str, Section]:
    """``## Agent version`` sections, each with its ``# path`` files and its ``# shell`` lines."""
    found = {}
    for chunk in re.split(r"^## ", output, flags=re.MULTILINE)[1:]:
        title, _, body = chunk.partition("\n")
        parts = re.split(r"^# (~/\S+|shell)$", body, flags=re.MULTILINE)
        files = {parts[i]: parts[i + 1].strip("\n") + "\n" for i in range(1, len(parts) - 2, 2)}
        assert parts[-2] == "shell", title
        found[title.rsplit(" ", 1)[0]] = Section(files, parts[-1].strip("\n").splitlines())
    return found


@dataclass(frozen=True)
class Case:
    agent: Agent
    name: str  # the section's title
    start: str  # the printed last line
    run: str  # what the test runs instead: non-interactive, the prompt on stdin or as an argument


CASES = {
    "claude-code": Case(CLAUDE_CODE, "Claude Code", "claude", f"claude -p --output-format json {PROMPT!r}"),
    "codex": Case(CODEX, "Codex CLI", "codex", "codex exec --skip-git-repo-check --json -s read-only -"),
    "opencode": Case(OPENCODE, "OpenCode", "opencode", f"opencode run {PROMPT!r}"),
}


@pytest.mark.timeout(600)
@pytest.mark.parametrize("agent", list(CASES))
def test_the_printed_setup_runs_the_agent_through_turnout(
    agent: str, agent_home: Path, roomy: AgentStack
) -> None:
    case = CASES[agent]
    executable = installed(case.agent)
    printed = subprocess.run(
        [str(Path(sys.executable).with_name("turnout")), "agents", "--url", roomy.url, "--model", MODEL],
        capture_output=True, text=True, timeout=60, check=True,
    ).stdout  # fmt: skip
    section = sections(printed)[case.name]
    for path, content in section.files.items():
        target = agent_home / path.removeprefix("~/")
        target.parent.mkdir(parents=True, exist_ok=True)
        target.write_text(content)
    *exports, start = section.shell
    assert start == case.start
    assert all(line.startswith("export ") for line in exports)
    env = {
        "PATH": f"{executable.parent}{os.pathsep}{os.environ['PATH']}",
        "HOME": str(agent_home),
        "TERM": "dumb",
        "NO_COLOR": "1",
        # no network here: OpenCode would fetch models.dev; the window comes from its opencode.json
        "OPENCODE_DISABLE_MODELS_FETCH": "1",
        "OPENCODE_DISABLE_AUTOUPDATE": "1",
    }
    before = len(roomy.decisions())
    done = subprocess.run(
        ["bash", "-c", "\n".join([*exports, case.run])], cwd=agent_home / "work", env=env, input=PROMPT,
        capture_output=True, text=True, timeout=240, check=False,
    )  # fmt: skip
    assert done.returncode == 0, f"{agent} failed:\n{done.stdout[-3000:]}\n{done.stderr[-3000:]}"
    answered = [e for e in roomy.decisions()[before:] if e["model"] == MODEL and e["status"] == 200]
    assert answered, "the agent sent nothing through turnout"
    if agent == "claude-code":
        result = json.loads(done.stdout)
        assert result["modelUsage"][MODEL]["contextWindow"] == 94_000  # read from ~/.claude/settings.json
