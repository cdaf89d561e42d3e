"""Install (or reuse) the pinned coding agents the agent tests run: Claude Code, Codex CLI, OpenCode.

Each lives outside the repository, under ``$TURNOUT_CACHE`` (default ``~/.cache/turnout``), as
``agents/<name>-<version>``, installed there by ``npm install --prefix``. A file lock keeps two runs
from installing at once, and a marker file, written only after the install and a ``--version`` check
succeeded, says it is complete; an install without it is removed and made again.

Run ``python tests/real/agents.py`` to install them by hand. With ``--if-possible``, a machine without
Node.js >= 18 and npm is reported and the command succeeds (the agent tests then skip with the same
reason); an install that starts and fails always fails.
"""

from __future__ import annotations

import argparse
import fcntl
import os
import re
import shutil
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

MIN_NODE = 18


@dataclass(frozen=True)
class Agent:
    name: str
    package: str
    version: str
    binary: str

    @property
    def home(self) -> Path:
        return cache_root() / "agents" / f"{self.name}-{self.version}"

    @property
    def executable(self) -> Path:
        return self.home / "node_modules" / ".bin" / self.binary

    @property
    def marker(self) -> Path:
        return self.home / ".turnout-installed"


CLAUDE_CODE = Agent("claude-code", "@anthropic-ai/claude-code", "2.1.332", "claude")
CODEX = Agent("codex", "@openai/codex", "0.171.0", "codex")
OPENCODE = Agent("opencode", "opencode-ai", "1.18.33", "opencode")
AGENTS = (CLAUDE_CODE, CODEX, OPENCODE)


def cache_root() -> Path:
    return Path(os.environ.get("TURNOUT_CACHE", Path.home() / ".cache" / "turnout"))


def cannot_install_reason() -> str | None:
    """Why the agents cannot run on this machine, or None."""
    node, npm = shutil.which("node"), shutil.which("npm")
    if node is None or npm is None:
        return "the agent tests need Node.js >= 18 and npm on PATH (not found)"
    version = subprocess.run([node, "--version"], capture_output=True, text=True, check=False).stdout
    found = re.match(r"v(\d+)", version.strip())
    if found is None or int(found.group(1)) < MIN_NODE:
        return f"the agent tests need Node.js >= {MIN_NODE}; this machine has {version.strip() or 'unknown'}"
    return None


def version_of(agent: Agent) -> str:
    result = subprocess.run(
        [str(agent.executable), "--version"], capture_output=True, text=True, timeout=60, check=True
    )
    return result.stdout.strip()


def ensure(agent: Agent) -> Path:
    """The agent's executable, installed first if needed."""
    if agent.marker.is_file():
        return agent.executable
    agent.home.parent.mkdir(parents=True, exist_ok=True)
    with open(agent.home.parent / f"{agent.name}.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        if agent.marker.is_file():  # another run installed it meanwhile
            return agent.executable
        node_modules = agent.home / "node_modules"
        if node_modules.exists():
            shutil.rmtree(node_modules)  # a half-done install
        agent.home.mkdir(parents=True, exist_ok=True)
        print(f"installing {agent.package}@{agent.version} into {agent.home}", file=sys.stderr)
        subprocess.run(
            ["npm", "install", "--prefix", str(agent.home), "--no-audit", "--no-fund", "--loglevel=error",
             f"{agent.package}@{agent.version}"],
            check=True,
            timeout=900,
        )  # fmt: skip
        reported = version_of(agent)
        if agent.version not in reported:
            raise RuntimeError(f"{agent.executable} --version says {reported!r}, not {agent.version}")
        agent.marker.write_text(reported + "\n")
    return agent.executable


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument(
        "--if-possible", action="store_true", help="succeed, saying why, where Node is missing"
    )
    args = parser.parse_args()
    reason = cannot_install_reason()
    if reason is not None:
        print(f"agents: not installed: {reason}", file=sys.stderr)
        return 0 if args.if_possible else 1
    for agent in AGENTS:
        print(f"{agent.name} {agent.version}: {ensure(agent)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
