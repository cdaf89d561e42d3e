"""``/v1/models`` and ``/v1/models/{id}`` in each API's shape, with the windows agents need."""

from __future__ import annotations

import json
import re
from collections.abc import Iterator

import anthropic
import httpx
import pytest

from backends.sim import SimConfig
from policies import Architecture
from tests.e2e.conftest import Stack, start_stack, stop_stack
from tests.servers import ADMIN

ANTHROPIC = {"anthropic-version": "2023-06-01", "x-api-key": "k"}
MODEL_INFO_FIELDS = {
    "type", "id", "display_name", "created_at", "lifecycle", "max_input_tokens", "max_tokens",
    "capabilities", "line", "deprecated_at", "retires_at",
}  # fmt: skip
"""The anthropic SDK's ``ModelInfo`` (anthropic/types/model_info.py, 2.14.0)."""


@pytest.fixture(scope="module")
def stack() -> Iterator[Stack]:
    """vLLM with a 40,000-token window; llama.cpp with 2 slots of 16,384 tokens each (the simulator's
    window is per slot)."""
    running = start_stack(
        vllm=SimConfig(
            kind="vllm",
            model="up-vllm",
            time_scale=0.002,
            architecture=Architecture.HYBRID,
            context_window=40_000,
        ),
        llama=SimConfig(kind="llamacpp", model="up-llama", time_scale=0.002, slots=2, context_window=16_384),
        extra_models=[
            {
                "name": "Qwen/Qwen3.5-27B",
                "display_name": "Qwen 3.5 27B",
                "max_output_tokens": 8192,
                "deployments": [{"backend": "vllm", "upstream_name": "up-vllm"}],
            }
        ],
    )
    try:
        _wait_probed(running)
        yield running
    finally:
        stop_stack(running)


def _wait_probed(stack: Stack) -> None:
    """Until both probes reported their engines' windows (the configured ones are unset)."""
    for _ in range(200):
        backends = httpx.get(stack.url + "/v1/models").json()["data"][2]["backends"]
        if all(b["context_window"] for b in backends):
            return
        import time

        time.sleep(0.05)
    raise AssertionError("the probes never reported the windows")


def test_openai_listing_gives_each_models_largest_live_window(stack: Stack) -> None:
    data = {m["id"]: m for m in httpx.get(stack.url + "/v1/models").json()["data"]}
    assert data["m-vllm"]["context_window"] == 40_000
    assert data["m-llama"]["context_window"] == 16_384  # per slot: what one request meets
    assert data["m-both"]["context_window"] == 40_000
    assert {b["id"]: b["context_window"] for b in data["m-both"]["backends"]} == {
        "vllm": 40_000,
        "llama": 16_384,
    }
    assert data["m-both"]["max_output_tokens"] == 10_000  # a quarter of the window
    assert data["Qwen/Qwen3.5-27B"]["max_output_tokens"] == 8192
    assert {"id", "object", "created", "owned_by"} <= set(data["m-vllm"])
    assert data["m-vllm"]["object"] == "model"


CODEX_REQUIRED = {
    "slug", "display_name", "supported_reasoning_levels", "shell_type", "visibility", "supported_in_api",
    "priority", "support_verbosity", "truncation_policy", "experimental_supported_tools", "base_instructions",
}  # fmt: skip
"""What Codex 0.171.0's catalog decoder requires of an entry (found field by field, docs/agents.md)."""


def test_codex_gets_its_catalog_beside_openais_list(stack: Stack) -> None:
    assert "models" not in httpx.get(stack.url + "/v1/models").json()
    body = httpx.get(stack.url + "/v1/models", params={"client_version": "0.171.0"}).json()
    assert [m["id"] for m in body["data"]] == [m["slug"] for m in body["models"]]
    qwen = body["models"][-1]
    assert qwen.keys() >= CODEX_REQUIRED
    assert (qwen["slug"], qwen["display_name"]) == ("Qwen/Qwen3.5-27B", "Qwen 3.5 27B")
    assert qwen["context_window"] == qwen["max_context_window"] == 40_000
    assert qwen["base_instructions"].startswith("You are a coding agent running in the Codex CLI")


def test_anthropic_clients_get_anthropic_model_objects(stack: Stack) -> None:
    body = httpx.get(stack.url + "/v1/models", headers=ANTHROPIC).json()
    assert set(body) == {"data", "first_id", "last_id", "has_more"}
    assert body["has_more"] is False
    assert body["first_id"] == "m-vllm"
    assert body["last_id"] == "Qwen/Qwen3.5-27B"
    for model in body["data"]:
        assert set(model) == MODEL_INFO_FIELDS
        assert model["type"] == "model"
        assert re.fullmatch(r"\d{4}-\d\d-\d\dT\d\d:\d\d:\d\dZ", model["created_at"])
    qwen = body["data"][-1]
    assert (qwen["display_name"], qwen["max_input_tokens"], qwen["max_tokens"]) == (
        "Qwen 3.5 27B",
        40_000,
        8192,
    )


def test_the_anthropic_sdk_reads_them(stack: Stack) -> None:
    client = anthropic.Anthropic(base_url=stack.url, api_key="k")
    models = {m.id: m for m in client.models.list(limit=10)}
    assert models["m-both"].max_input_tokens == 40_000
    assert models["m-both"].lifecycle == "active"
    one = client.models.retrieve("Qwen/Qwen3.5-27B")
    assert (one.display_name, one.max_input_tokens, one.max_tokens) == ("Qwen 3.5 27B", 40_000, 8192)
    with pytest.raises(anthropic.NotFoundError):
        client.models.retrieve("nope")


def test_anthropic_listing_pages(stack: Stack) -> None:
    url = stack.url + "/v1/models"
    first = httpx.get(url, headers=ANTHROPIC, params={"limit": 2}).json()
    assert [m["id"] for m in first["data"]] == ["m-vllm", "m-llama"]
    assert first["has_more"] is True
    rest = httpx.get(url, headers=ANTHROPIC, params={"limit": 2, "after_id": first["last_id"]}).json()
    assert [m["id"] for m in rest["data"]] == ["m-both", "Qwen/Qwen3.5-27B"]
    assert rest["has_more"] is False
    before = httpx.get(url, headers=ANTHROPIC, params={"limit": 1, "before_id": "m-both"}).json()
    assert [m["id"] for m in before["data"]] == ["m-llama"]
    assert before["has_more"] is True
    bad = httpx.get(url, headers=ANTHROPIC, params={"limit": 0})
    assert bad.status_code == 400
    assert bad.json() == {
        "type": "error",
        "error": {"type": "invalid_request_error", "message": "limit: must be between 1 and 1000"},
    }


@pytest.mark.parametrize("name", ["m-both", "both", "Qwen/Qwen3.5-27B"])
def test_one_model_by_name_alias_or_slashed_name(stack: Stack, name: str) -> None:
    openai = httpx.get(f"{stack.url}/v1/models/{name}")
    assert openai.status_code == 200
    assert (openai.json()["id"], openai.json()["object"], openai.json()["context_window"]) == (
        name,
        "model",
        40_000,
    )
    anthropic = httpx.get(f"{stack.url}/v1/models/{name}", headers=ANTHROPIC)
    assert anthropic.status_code == 200
    assert set(anthropic.json()) == MODEL_INFO_FIELDS
    assert (anthropic.json()["id"], anthropic.json()["max_input_tokens"]) == (name, 40_000)


def test_unknown_model_is_a_404_in_each_apis_shape(stack: Stack) -> None:
    openai = httpx.get(stack.url + "/v1/models/nope")
    assert openai.status_code == 404
    assert openai.json()["error"]["code"] == "model_not_found"
    assert "m-both" in openai.json()["error"]["message"]
    anthropic = httpx.get(stack.url + "/v1/models/nope", headers=ANTHROPIC)
    assert anthropic.status_code == 404
    assert anthropic.json()["type"] == "error"
    assert anthropic.json()["error"]["type"] == "not_found_error"


def test_a_conversation_that_outgrows_llamas_window_moves_to_vllm_and_says_what_it_cost() -> None:
    running = start_stack(
        vllm=SimConfig(
            kind="vllm",
            model="up-vllm",
            time_scale=0.002,
            architecture=Architecture.HYBRID,
            context_window=40_000,
        ),
        llama=SimConfig(kind="llamacpp", model="up-llama", time_scale=0.002, slots=2, context_window=4096),
        profile="prefer-llamacpp",
    )
    try:
        _wait_probed(running)
        history = [{"role": "user", "content": "word " * 1500}]
        headers = {"x-session-id": "grows"}
        with running.client(headers=headers) as client:
            first = client.post(
                "/v1/chat/completions", json={"model": "m-both", "messages": history, "max_tokens": 4}
            )
            assert first.headers["x-turnout-backend"] == "llama"
            history += [
                {"role": "assistant", "content": first.json()["choices"][0]["message"]["content"]},
                {"role": "user", "content": "word " * 6000},
            ]
            second = client.post(
                "/v1/chat/completions", json={"model": "m-both", "messages": history, "max_tokens": 4}
            )
            assert second.status_code == 200
            assert second.headers["x-turnout-backend"] == "vllm"
            entry = client.get("/admin/api/decisions", headers=ADMIN, params={"limit": 1}).json()["data"][0]
        moved = entry["moved"]
        assert (moved["from"], moved["to"]) == ("llama", "vllm")
        assert moved["reprefill_tokens"] == moved["prompt_tokens"] > 4096  # vLLM has none of it
        assert moved["prefill_s"] > 0
        assert any(r["backend"] == "llama" and r["reason"] == "context-too-long" for r in entry["rejected"])
    finally:
        stop_stack(running)


def test_the_configured_output_limit_caps_requests_that_set_none(stack: Stack) -> None:
    tap = stack.taps["vllm"]
    messages = [{"role": "user", "content": "hi"}]
    with stack.client() as client:
        client.post("/v1/chat/completions", json={"model": "Qwen/Qwen3.5-27B", "messages": messages})
        assert json.loads(tap.requests[-1])["max_tokens"] == 8192
        client.post(
            "/v1/chat/completions", json={"model": "Qwen/Qwen3.5-27B", "messages": messages, "max_tokens": 3}
        )
        assert json.loads(tap.requests[-1])["max_tokens"] == 3
        client.post("/v1/responses", json={"model": "Qwen/Qwen3.5-27B", "input": "hi"})
        assert json.loads(tap.requests[-1])["max_output_tokens"] == 8192
        client.post("/v1/chat/completions", json={"model": "m-vllm", "messages": messages})  # none configured
        assert "max_tokens" not in json.loads(tap.requests[-1])
