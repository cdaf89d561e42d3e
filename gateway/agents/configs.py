"""``turnout agents``: ready-to-use settings for each coding agent, from turnout's own windows.

An agent that does not know its model's window guesses (Claude Code: 200k or 1M, Codex: 272k,
OpenCode: no compaction at all), never compacts in time, and fails every turn once the conversation
outgrows the real window. turnout knows every window, so it writes each agent's settings: the base
URL, a token, the model, the window and the output limit, in the variables that agent's pinned version
reads (docs/agents.md cites each one).

The numbers come from the running gateway (``GET /v1/models``: the largest window each model can be
routed to now) or, without one, from the config file (the configured windows).
"""

from __future__ import annotations

import json
import shlex
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path

import httpx

from gateway.catalog import Catalog, max_output_tokens
from gateway.settings import Settings

PLACEHOLDER_KEY = "turnout"
"""The token agents send when none is given: any non-empty value passes a gateway without keys."""


class AgentConfigError(Exception):
    """Why the settings cannot be written (no gateway answering, an unknown model, no window)."""


@dataclass(frozen=True, slots=True)
class ModelLimits:
    name: str
    context_window: int
    max_output_tokens: int


@dataclass(frozen=True, slots=True)
class AgentFile:
    path: str  # where the agent reads it
    content: str


@dataclass(frozen=True, slots=True)
class AgentSetup:
    """One agent's settings: its files, the environment to export, and how to start it."""

    agent: str
    version: str  # the version these settings were researched and tested with
    files: tuple[AgentFile, ...]
    env: tuple[tuple[str, str], ...]
    command: str

    def text(self) -> str:
        out = [f"## {self.agent} {self.version}", ""]
        for file in self.files:
            out += [f"# {file.path}", file.content.rstrip("\n"), ""]
        out += [
            "# shell",
            *(f"export {name}={shlex.quote(value)}" for name, value in self.env),
            self.command,
            "",
        ]
        return "\n".join(out)

    def write(self, directory: Path) -> list[Path]:
        """The files under ``directory`` by their base names, plus ``env.sh``."""
        directory.mkdir(parents=True, exist_ok=True)
        written = []
        for file in self.files:
            path = directory / Path(file.path).name
            path.write_text(file.content, encoding="utf-8")
            written.append(path)
        env = directory / "env.sh"
        env.write_text("".join(f"export {n}={shlex.quote(v)}\n" for n, v in self.env), encoding="utf-8")
        return [*written, env]


@dataclass(frozen=True, slots=True)
class Target:
    """Where the agent connects and what it may send."""

    url: str  # the gateway's root, without /v1
    api_key: str
    model: ModelLimits
    small_model: ModelLimits  # for an agent's background chores (titles, summaries)


def from_gateway(url: str, timeout: float = 5.0) -> list[ModelLimits]:
    """Each model's limits as the running gateway reports them now."""
    try:
        response = httpx.get(url.rstrip("/") + "/v1/models", timeout=timeout)
        response.raise_for_status()
        data = response.json()["data"]
    except (httpx.HTTPError, ValueError, KeyError, TypeError) as exc:
        raise AgentConfigError(f"cannot read {url}/v1/models: {exc}") from exc
    models = []
    for entry in data:
        window = entry.get("context_window")
        if isinstance(window, int):
            models.append(
                ModelLimits(entry["id"], window, int(entry.get("max_output_tokens") or window // 4))
            )
    return models


def from_settings(settings: Settings) -> list[ModelLimits]:
    """Each model's limits from the configured windows (what the engines report may be smaller)."""
    catalog = Catalog(settings.models, created=0, groups=settings.groups)
    out = []
    for model in catalog.models:
        window = catalog.window(model, [])
        if window is not None:
            out.append(ModelLimits(model.name, window, max_output_tokens(model, window)))
    return out


def pick(models: Sequence[ModelLimits], name: str | None) -> ModelLimits:
    if not models:
        raise AgentConfigError(
            "no model with a known context window: start the gateway (and its engines), or set "
            "context_window on a deployment in the config"
        )
    if name is None:
        return models[0]
    for model in models:
        if model.name == name:
            return model
    raise AgentConfigError(f"no model `{name}`; known: {', '.join(m.name for m in models)}")


def claude_code(target: Target) -> AgentSetup:
    """Claude Code 2.1.332: the ``env`` block of ``~/.claude/settings.json``.

    Claude Code does not ask the gateway for a window (it reads no ``max_input_tokens``): a model id it
    does not know gets ``CLAUDE_CODE_MAX_CONTEXT_TOKENS``, else an assumed 1M (with a warning). It
    compacts at window - min(output, 20,000) - 13,000; ``CLAUDE_CODE_AUTO_COMPACT_WINDOW`` cannot
    describe a window under 100k. On "prompt is too long: N tokens > M maximum" it compacts and resends
    the turn. Background chores (titles, summaries) use the haiku / small-fast model.
    """
    model, small = target.model, target.small_model
    env = {
        "ANTHROPIC_BASE_URL": target.url,
        "ANTHROPIC_AUTH_TOKEN": target.api_key,
        "ANTHROPIC_MODEL": model.name,
        "ANTHROPIC_DEFAULT_OPUS_MODEL": model.name,
        "ANTHROPIC_DEFAULT_SONNET_MODEL": model.name,
        "ANTHROPIC_DEFAULT_HAIKU_MODEL": small.name,
        "ANTHROPIC_SMALL_FAST_MODEL": small.name,
        "CLAUDE_CODE_SUBAGENT_MODEL": model.name,
        "CLAUDE_CODE_MAX_CONTEXT_TOKENS": str(model.context_window),
        "CLAUDE_CODE_MAX_OUTPUT_TOKENS": str(model.max_output_tokens),
        "CLAUDE_CODE_DISABLE_NONESSENTIAL_TRAFFIC": "1",  # a workstation may be offline
        "DISABLE_TELEMETRY": "1",
        "DISABLE_AUTOUPDATER": "1",
        "DISABLE_ERROR_REPORTING": "1",
    }
    return AgentSetup(
        "Claude Code",
        "2.1.332",
        (AgentFile("~/.claude/settings.json", json.dumps({"env": env}, indent=2) + "\n"),),
        (),
        "claude",
    )


def codex(target: Target) -> AgentSetup:
    """Codex CLI 0.171.0: ``$CODEX_HOME/config.toml`` (default ``~/.codex``).

    Codex reads the window from turnout's catalog (``model_catalog_url``, fetched only with an
    ``env_key``), which also ends its "fallback metadata" warning; ``model_context_window`` is there
    for a gateway that cannot be reached. It compacts at 90% of the window and clamps a higher
    ``model_auto_compact_token_limit`` to that. It sends no output limit (turnout applies the model's
    ``max_output_tokens``). The provider must not be named "OpenAI" (that switches on OpenAI-only
    request compression and remote compaction).
    """
    model = target.model
    config = f"""\
model = "{model.name}"
model_provider = "turnout"
model_context_window = {model.context_window}
model_auto_compact_token_limit = {model.context_window * 9 // 10}
web_search = "disabled"  # local models cannot search the web

[agents]
enabled = false  # no multi-agent tool: a local model serves one agent at a time

[model_providers.turnout]
name = "turnout"
base_url = "{target.url}/v1"
env_key = "TURNOUT_API_KEY"
wire_api = "responses"
model_catalog_url = "{target.url}/v1/models"
stream_idle_timeout_ms = 600000  # a queued llama.cpp request sends nothing until a slot frees
"""
    return AgentSetup(
        "Codex CLI",
        "0.171.0",
        (AgentFile("~/.codex/config.toml", config),),
        (("TURNOUT_API_KEY", target.api_key),),
        "codex",
    )


def opencode(target: Target) -> AgentSetup:
    """OpenCode 1.18: ``opencode.json``. Without ``limit`` a custom model never compacts and asks for
    32,000 output tokens; with it, OpenCode compacts once usage reaches context - output."""
    model, small = target.model, target.small_model
    models = {
        m.name: {"name": m.name, "limit": {"context": m.context_window, "output": m.max_output_tokens}}
        for m in (model, small)
    }
    config = {
        "$schema": "https://opencode.ai/config.json",
        "model": f"turnout/{model.name}",
        "small_model": f"turnout/{small.name}",
        "provider": {
            "turnout": {
                "npm": "@ai-sdk/openai-compatible",
                "name": "turnout",
                "options": {"baseURL": f"{target.url}/v1", "apiKey": "{env:TURNOUT_API_KEY}"},
                "models": models,
            }
        },
        "compaction": {"auto": True},
    }
    return AgentSetup(
        "OpenCode",
        "1.18.33",
        (AgentFile("~/.config/opencode/opencode.json", json.dumps(config, indent=2) + "\n"),),
        (("TURNOUT_API_KEY", target.api_key),),
        "opencode",
    )


def aider(target: Target) -> AgentSetup:
    """aider 0.86: ``.aider.model.metadata.json`` gives the window (``max_input_tokens``, keyed by the
    ``openai/`` name), ``.aider.model.settings.yml`` the output limit it sends. aider does not compact:
    it summarises old history and stops on an overflow (recognised by OpenAI's wording)."""
    model = target.model
    name = f"openai/{model.name}"
    metadata = {
        name: {
            "max_input_tokens": model.context_window,
            "max_output_tokens": model.max_output_tokens,
            "max_tokens": model.max_output_tokens,
            "input_cost_per_token": 0,
            "output_cost_per_token": 0,
            "litellm_provider": "openai",
            "mode": "chat",
        }
    }
    settings = f"- name: {name}\n  extra_params:\n    max_tokens: {model.max_output_tokens}\n"
    return AgentSetup(
        "aider",
        "0.86.2",
        (
            AgentFile("~/.aider.model.metadata.json", json.dumps(metadata, indent=2) + "\n"),
            AgentFile("~/.aider.model.settings.yml", settings),
        ),
        (("OPENAI_API_BASE", f"{target.url}/v1"), ("OPENAI_API_KEY", target.api_key)),
        f"aider --model {name}",
    )


AGENTS: dict[str, Callable[[Target], AgentSetup]] = {
    "claude-code": claude_code,
    "codex": codex,
    "opencode": opencode,
    "aider": aider,
}
