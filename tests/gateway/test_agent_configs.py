"""``turnout agents``: each agent's settings carry the model's window and output limit."""

from __future__ import annotations

import json
import tomllib
from pathlib import Path

import pytest

from gateway.agents.configs import AGENTS, ModelLimits, Target
from gateway.cli import local_gateway_url, main

DEMO = Path(__file__).resolve().parents[2] / "gateway" / "demo.toml"
TARGET = Target("http://gw:8484", "k", ModelLimits("big", 94_000, 8192), ModelLimits("small", 65_536, 4096))


def test_claude_code_settings() -> None:
    (file,) = AGENTS["claude-code"](TARGET).files
    env = json.loads(file.content)["env"]
    assert file.path == "~/.claude/settings.json"
    assert env["ANTHROPIC_BASE_URL"] == "http://gw:8484"
    assert (env["ANTHROPIC_MODEL"], env["ANTHROPIC_SMALL_FAST_MODEL"]) == ("big", "small")
    assert (env["CLAUDE_CODE_MAX_CONTEXT_TOKENS"], env["CLAUDE_CODE_MAX_OUTPUT_TOKENS"]) == ("94000", "8192")
    assert "CLAUDE_CODE_AUTO_COMPACT_WINDOW" not in env  # its 100k minimum cannot say 94k


def test_codex_config() -> None:
    setup = AGENTS["codex"](TARGET)
    config = tomllib.loads(setup.files[0].content)
    assert (config["model"], config["model_context_window"]) == ("big", 94_000)
    assert config["model_auto_compact_token_limit"] == 84_600  # Codex clamps anything higher to 90%
    provider = config["model_providers"][config["model_provider"]]
    assert provider["name"] != "OpenAI"
    assert provider["wire_api"] == "responses"
    assert provider["model_catalog_url"] == "http://gw:8484/v1/models"
    assert dict(setup.env) == {provider["env_key"]: "k"}


def test_opencode_and_aider() -> None:
    opencode = json.loads(AGENTS["opencode"](TARGET).files[0].content)
    models = opencode["provider"]["turnout"]["models"]
    assert models["big"]["limit"] == {"context": 94_000, "output": 8192}
    assert models["small"]["limit"] == {"context": 65_536, "output": 4096}
    metadata, settings = AGENTS["aider"](TARGET).files
    assert json.loads(metadata.content)["openai/big"]["max_input_tokens"] == 94_000
    assert "max_tokens: 8192" in settings.content


def test_cli_from_a_config_file_writes_every_agent(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    assert main(["agents", "--config", str(DEMO), "--out", str(tmp_path)]) == 0
    written = sorted(p.relative_to(tmp_path).as_posix() for p in tmp_path.rglob("*") if p.is_file())
    assert written == [
        "aider/.aider.model.metadata.json", "aider/.aider.model.settings.yml", "aider/env.sh",
        "claude-code/env.sh", "claude-code/settings.json", "codex/config.toml", "codex/env.sh",
        "opencode/env.sh", "opencode/opencode.json",
    ]  # fmt: skip
    env = json.loads((tmp_path / "claude-code" / "settings.json").read_text())["env"]
    assert env["CLAUDE_CODE_MAX_CONTEXT_TOKENS"] == "94000"  # the demo's configured vLLM window
    assert main(["agents", "--config", str(DEMO), "--agent", "codex", "--model", "qwen3.8-flash-next"]) == 0
    assert "model_context_window = 65536" in capsys.readouterr().out


def test_cli_errors_say_why(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["agents", "--url", "http://127.0.0.1:9"]) == 1
    assert "cannot read http://127.0.0.1:9/v1/models" in capsys.readouterr().err
    assert main(["agents", "--config", str(DEMO), "--model", "nope"]) == 1
    assert "no model `nope`; known: qwen3.8-27b, qwen3.8-flash-next" in capsys.readouterr().err


@pytest.mark.parametrize(
    ("env", "expected"),
    [
        ({}, "http://127.0.0.1:8484"),
        ({"TURNOUT_PORT": "9001"}, "http://127.0.0.1:9001"),
        (
            {"TURNOUT_HOST": "0.0.0.0", "TURNOUT_PORT": "9001"},
            "http://127.0.0.1:9001",
        ),  # a wildcard: loopback
        ({"TURNOUT_HOST": "::"}, "http://127.0.0.1:8484"),
        ({"TURNOUT_HOST": "::1"}, "http://[::1]:8484"),
        ({"TURNOUT_HOST": "10.1.2.3"}, "http://10.1.2.3:8484"),
    ],
)
def test_without_url_agents_asks_the_gateway_where_turnout_host_and_port_put_it(
    monkeypatch: pytest.MonkeyPatch, env: dict[str, str], expected: str
) -> None:
    """``TURNOUT_PORT=9001 turnout demo`` in one terminal, ``TURNOUT_PORT=9001 turnout agents`` in another."""
    monkeypatch.delenv("TURNOUT_HOST", raising=False)
    monkeypatch.delenv("TURNOUT_PORT", raising=False)
    for name, value in env.items():
        monkeypatch.setenv(name, value)
    assert local_gateway_url() == expected
