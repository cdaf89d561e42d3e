"""A residency switch through ``turnout serve`` on the real llama-server in router mode (the pinned build,
the tiny qwen35 GGUF under two names): the GPUs go from one model to the other and back, a session's
slot is saved before the unload and restored after the load, so its next turn is still warm
(issue #62 items 1 and 2; docs/residency.md)."""

from __future__ import annotations

import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from gateway.app import create_app
from gateway.settings import load_settings
from tests.real.llama_server import LlamaRouterServer
from tests.servers import ADMIN, serve

SESSION = {"x-session-id": "router-agent"}


@pytest.fixture
def router(llama_binary: Path, qwen35_gguf: Path, tmp_path: Path) -> Iterator[LlamaRouterServer]:
    models = tmp_path / "models"
    models.mkdir()
    (tmp_path / "slots").mkdir()
    for name in ("q27", "flash"):  # one GGUF under two names: two models of the router
        (models / f"{name}.gguf").symlink_to(qwen35_gguf)
    server = LlamaRouterServer(
        llama_binary, models, slot_dir=tmp_path / "slots", log_path=tmp_path / "router.log"
    ).start()
    try:
        yield server
    finally:
        server.stop()


def status(url: str, model: str) -> str:
    entries = httpx.get(url + "/models", timeout=10).json()["data"]
    return str(next(e for e in entries if e["id"] == model)["status"]["value"])


def until(predicate: Any, timeout: float = 120.0) -> None:
    deadline = time.monotonic() + timeout
    while not predicate():
        assert time.monotonic() < deadline, "timed out"
        time.sleep(0.05)


def switched(client: httpx.Client, target: str) -> dict[str, Any]:
    accepted = client.post("/admin/api/residency/cards", json={"wake": target}, headers=ADMIN)
    assert accepted.status_code == 202, accepted.text
    state: dict[str, Any] = {}

    def done() -> bool:
        state.update(client.get("/admin/api/residency", headers=ADMIN).json()["data"][0])
        return state["switch"] is None

    until(done)
    last: dict[str, Any] = state["history"][0]
    assert last["result"] == "done", last
    return last


def chat(client: httpx.Client, model: str, messages: list[dict[str, str]]) -> httpx.Response:
    body = {"model": model, "messages": messages, "max_tokens": 4, "temperature": 0}
    return client.post("/v1/chat/completions", json=body, headers=SESSION)


def test_a_switch_in_router_mode_unloads_loads_and_keeps_the_session_warm(
    router: LlamaRouterServer, tmp_path: Path
) -> None:
    engine = {"url": router.base_url, "kind": "llamacpp", "probe_interval_s": 0.2, "timeouts": {"probe": 10}}
    settings = load_settings(
        None,
        backends=[{"id": "llama-q27", **engine}, {"id": "llama-flash", **engine}],
        models=[
            {"name": "q27", "architecture": "hybrid",
             "deployments": [{"backend": "llama-q27", "upstream_name": "q27"}]},
            {"name": "flash", "architecture": "hybrid",
             "deployments": [{"backend": "llama-flash", "upstream_name": "flash"}]},
        ],
        residency=[{"name": "cards", "members": [{"backend": "llama-q27"}, {"backend": "llama-flash"}],
                    "awake": "llama-q27", "step_timeout_s": 120}],
    )  # fmt: skip
    with serve(create_app(settings)) as gateway, httpx.Client(base_url=gateway.url, timeout=120) as client:
        until(lambda: status(router.base_url, "q27") == "loaded")  # at start: the awake member is loaded
        assert status(router.base_url, "flash") == "unloaded"
        until(lambda: client.get("/health").json()["backends"]["llama-q27"] == "ready")

        first = [
            {"role": "user", "content": "Tell me about the repository layout and the routing code. " * 6}
        ]
        one = chat(client, "q27", first)
        assert one.status_code == 200, one.text
        assert one.headers["x-turnout-backend"] == "llama-q27"
        answer = one.json()["choices"][0]["message"]

        there = switched(client, "llama-flash")
        assert set(there["steps_s"]) == {"drain", "free", "wake", "probe"}
        assert status(router.base_url, "q27") == "unloaded"
        assert status(router.base_url, "flash") == "loaded"
        assert list((tmp_path / "slots").iterdir())  # the session's slot, saved before the unload
        asleep = chat(client, "q27", first)
        assert asleep.status_code == 503
        assert "asleep: residency set 'cards' holds llama-flash awake" in asleep.json()["error"]["message"]
        other = chat(client, "flash", [{"role": "user", "content": "hello"}])
        assert other.status_code == 200, other.text
        assert other.headers["x-turnout-backend"] == "llama-flash"

        switched(client, "llama-q27")
        second = [*first, {"role": "assistant", "content": answer.get("content") or ""},
                  {"role": "user", "content": "And the tests?"}]  # fmt: skip
        two = chat(client, "q27", second)
        assert two.status_code == 200, two.text
        usage = two.json()["usage"]
    # the restored slot held the whole first turn: its prompt and answer are reused
    assert usage["prompt_tokens_details"]["cached_tokens"] >= one.json()["usage"]["prompt_tokens"]
