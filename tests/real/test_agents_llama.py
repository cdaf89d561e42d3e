"""The pinned Claude Code and Codex CLI through turnout in front of a real llama-server.

The tiny random model is held to one short answer by a server-wide grammar (``ANSWER_GRAMMAR``):
what is checked is the plumbing. Each agent completes its turns on one slot, and llama-server's own
``cache_n`` grows.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from gateway.agents.configs import AGENTS, Target, from_gateway, pick
from gateway.app import create_app
from gateway.settings import load_settings
from tests.agents.harness import installed, run_claude, run_codex
from tests.real.agents import CLAUDE_CODE, CODEX, cache_root
from tests.real.conftest import qwen35_model
from tests.real.llama_server import DEFAULT_ALIAS, LlamaServer
from tests.servers import ADMIN, ServerThread

pytestmark = [pytest.mark.real_llama, pytest.mark.timeout(1200)]

SLOT_CTX = 40_960  # Claude Code's instructions and tools are ~17k tokens, Codex's ~11k
OUTPUT = 64
ANSWER_GRAMMAR = 'root ::= "OK, done."'
"""Every answer, then end of turn: a random model never picks its end-of-turn token, and an agent
takes a reply cut at ``max_tokens`` for an error (Claude Code: "response exceeded the output token
maximum")."""
MODEL = "tiny-coder"


@pytest.fixture(scope="module")
def real(llama_binary: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[LlamaServer]:
    server = LlamaServer(
        llama_binary,
        qwen35_model(context=SLOT_CTX),  # llama-server caps a slot at the model's training context
        log_path=tmp_path_factory.mktemp("agents") / "llama-server.log",
        n_parallel=2,
        ctx_total=2 * SLOT_CTX,
        extra_args=["--grammar", ANSWER_GRAMMAR],
    ).start()
    try:
        yield server
    finally:
        server.stop()


@pytest.fixture(scope="module")
def gateway(real: LlamaServer) -> Iterator[str]:
    settings = load_settings(
        None,
        backends=[
            {
                "id": "llama",
                "kind": "llamacpp",
                "url": real.base_url,
                "probe_interval_s": 0.2,
                "timeouts": {"probe": 10.0},
            }
        ],
        models=[
            {
                "name": MODEL,
                "architecture": "hybrid",
                "max_output_tokens": OUTPUT,
                "deployments": [{"backend": "llama", "upstream_name": DEFAULT_ALIAS}],
            }
        ],
    )
    server = ServerThread(create_app(settings)).start()
    try:
        _wait_window(server.url)
        yield server.url
    finally:
        server.stop()


def _wait_window(url: str) -> None:
    import time

    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        if httpx.get(url + "/v1/models").json()["data"][0]["backends"][0]["context_window"] == SLOT_CTX:
            return
        time.sleep(0.1)
    raise AssertionError("the probe never reported llama-server's window")


@pytest.fixture
def home() -> Iterator[Path]:
    import shutil
    import uuid

    path = cache_root() / "agent-homes" / uuid.uuid4().hex[:12]
    (path / "work").mkdir(parents=True)
    try:
        yield path
    finally:
        shutil.rmtree(path, ignore_errors=True)


def _setup(url: str, agent: str, directory: Path) -> None:
    model = pick(from_gateway(url), MODEL)
    assert (model.context_window, model.max_output_tokens) == (SLOT_CTX, OUTPUT)
    AGENTS[agent](Target(url, "test-key", model, model)).write(directory)


def _turns(url: str, endpoint: str, since: int) -> list[dict[str, Any]]:
    entries = httpx.get(url + "/admin/api/decisions", headers=ADMIN, params={"limit": 1000}).json()["data"]
    return [e for e in reversed(entries) if e["endpoint"] == endpoint][since:]


def _one_slot_growing_cache(entries: list[dict[str, Any]]) -> None:
    assert len(entries) >= 2
    assert {e["session"] for e in entries} == {entries[0]["session"]}
    assert {(e["chosen"], e["slot"]) for e in entries} == {("llama", entries[0]["slot"])}
    assert {e["status"] for e in entries} == {200}
    cached = [e["outcome"]["cached_tokens"] for e in entries]
    prompts = [e["outcome"]["prompt_tokens"] for e in entries]
    assert cached[-1] > cached[0]
    assert cached[-1] >= 0.9 * prompts[-2]  # llama-server reused the whole previous turn


def test_claude_code_on_a_real_llama_server(gateway: str, home: Path) -> None:
    claude = installed(CLAUDE_CODE)
    _setup(gateway, "claude-code", home / "claude-code")
    since = len(_turns(gateway, "messages", 0))
    result, stderr = run_claude(claude, home, "Say OK.")
    assert result["modelUsage"][MODEL]["contextWindow"] == SLOT_CTX
    assert "assumes a context window" not in stderr
    run_claude(claude, home, "And again.", "--continue")
    _one_slot_growing_cache(_turns(gateway, "messages", since))


def test_codex_on_a_real_llama_server(gateway: str, home: Path) -> None:
    codex = installed(CODEX)
    _setup(gateway, "codex", home / "codex")
    since = len(_turns(gateway, "responses", 0))
    events = run_codex(codex, home, "Say OK.")
    assert not any("fallback metadata" in str(e) for e in events)
    run_codex(codex, home, "resume", "--last", "And again.")
    _one_slot_growing_cache(_turns(gateway, "responses", since))
