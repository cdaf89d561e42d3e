"""The GPU-sharing deployment (deploy/residency/: an override of compose.yaml, the router's presets, its
turnout config), checked where no docker daemon runs: against the Compose Specification's schema, against
compose.yaml (what it changes and what it keeps), and against turnout's parser (docs/residency.md).
tests/real/test_llama_router_residency.py runs the router's command as written on the real llama-server."""

from __future__ import annotations

import configparser
from pathlib import Path
from typing import Any

import jsonschema
import pytest
import yaml

from gateway.settings import load_settings
from tests.deploy.test_compose import SCHEMA, SERVICES, option

REPO = Path(__file__).resolve().parents[2]
HERE = REPO / "deploy" / "residency"
OVERRIDE: dict[str, Any] = yaml.safe_load((HERE / "compose.yaml").read_text())


def presets() -> configparser.ConfigParser:
    parser = configparser.ConfigParser(inline_comment_prefixes=(";",))
    parser.read_string("[top]\n" + (HERE / "presets.ini").read_text())  # its first lines precede any section
    return parser


def test_the_override_is_valid_compose() -> None:
    errors = [e.message for e in jsonschema.Draft7Validator(SCHEMA).iter_errors(OVERRIDE)]
    assert errors == []
    assert set(OVERRIDE["services"]) <= {*SERVICES, "llama-router"}  # it adds the router, nothing else


def test_vllm_keeps_compose_flags_but_sleeps_with_a_bf16_kv_cache() -> None:
    """Every flag of compose.yaml's vLLM, except the KV cache's type and the context it buys, plus
    sleep mode; and the dev endpoints switched on."""
    base, over = SERVICES["vllm"]["command"], OVERRIDE["services"]["vllm"]["command"]
    changed = {"--kv-cache-dtype": ("fp8", "auto"), "--max-model-len": ("32768", "16384")}
    for flag, (was, now) in changed.items():
        assert (option(base, flag), option(over, flag)) == (was, now)
    assert over[-1] == "--enable-sleep-mode"
    assert [a for a in over if a not in ("--enable-sleep-mode",)] == [
        changed[base[i - 1]][1] if i and base[i - 1] in changed else a for i, a in enumerate(base)
    ]
    assert OVERRIDE["services"]["vllm"]["environment"] == {"VLLM_SERVER_DEV_MODE": "1"}


def test_the_router_serves_one_preset_at_a_time_and_saves_slots() -> None:
    router = OVERRIDE["services"]["llama-router"]
    command = router["command"]
    assert option(command, "--models-max") == "1"
    assert "--no-models-autoload" in command
    assert option(command, "--slot-save-path") == "/slots/"
    assert router["image"] == SERVICES["llama"]["image"]
    assert "llama-slots:/slots" in router["volumes"]
    sections = [s for s in presets().sections() if s not in ("top", "*")]
    assert sections == ["qwen3.8-27b-gguf", "qwen3.8-flash-next-gpu"]
    assert presets()["qwen3.8-flash-next-gpu"]["n-cpu-moe"] == "40"


def test_the_turnout_config_puts_both_presets_and_vllm_in_one_set(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("TURNOUT_ADMIN__TOKEN", "x")
    settings = load_settings(HERE / "turnout.toml")
    (cards,) = settings.residency
    assert [m.backend for m in cards.members] == ["vllm", "llama-27b", "llama-flash-gpu"]
    assert cards.first_awake == "vllm"
    routed = {m.router_model for m in cards.members if m.router_model}
    assert routed == set(presets().sections()) - {"top", "*"}  # each member is a preset of the router
    urls = {b.id: b.base_url for b in settings.backends}
    port = option(OVERRIDE["services"]["llama-router"]["command"], "--port")
    assert urls["llama-27b"] == urls["llama-flash-gpu"] == f"http://llama-router:{port}"
    vllm = next(d for m in settings.models for d in m.deployments if d.backend == "vllm")
    assert vllm.context_window == int(option(OVERRIDE["services"]["vllm"]["command"], "--max-model-len"))
    mounted = OVERRIDE["services"]["turnout"]["volumes"]
    assert mounted == ["./deploy/residency/turnout.toml:/etc/turnout/turnout.toml:ro"]
