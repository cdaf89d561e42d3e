"""API keys and per-key limits, through the official openai and anthropic SDKs."""

from __future__ import annotations

import hashlib
import time
from collections.abc import Iterator
from pathlib import Path

import anthropic
import httpx
import openai
import pytest
import structlog

from gateway.app import create_app
from gateway.settings import ConfigError, load_settings
from tests.e2e.conftest import Stack, start_stack, stop_stack
from tests.redis_server import RedisServer
from tests.servers import ADMIN, ServerThread

MESSAGES = [{"role": "user", "content": "hello"}]


@pytest.fixture(scope="module")
def stack() -> Iterator[Stack]:
    running = start_stack(
        auth={
            "keys": [
                {"name": "alice", "key": "sk-alice", "models": ["m-both"], "requests_per_minute": 3},
                {"name": "bob", "sha256": hashlib.sha256(b"sk-bob").hexdigest(), "concurrent": 1},
                {"name": "carol", "key": "sk-carol", "tokens_per_minute": 20},
            ]
        }
    )
    try:
        yield running
    finally:
        stop_stack(running)


def oai(stack: Stack | ServerThread, key: str) -> openai.OpenAI:
    return openai.OpenAI(base_url=stack.url + "/v1", api_key=key, max_retries=0)


def test_a_wrong_or_missing_key_is_refused_in_each_apis_shape(stack: Stack) -> None:
    with pytest.raises(openai.AuthenticationError) as refused:
        oai(stack, "sk-nope").chat.completions.create(model="m-both", messages=MESSAGES, max_tokens=2)  # type: ignore[arg-type]
    assert refused.value.code == "invalid_api_key"
    claude = anthropic.Anthropic(base_url=stack.url, api_key="sk-nope", max_retries=0)
    with pytest.raises(anthropic.AuthenticationError):
        claude.messages.create(model="m-both", max_tokens=2, messages=MESSAGES)  # type: ignore[arg-type]
    missing = httpx.post(
        stack.url + "/v1/chat/completions", json={"model": "m-both", "messages": MESSAGES}, timeout=30
    )
    assert missing.status_code == 401
    assert missing.json()["error"]["message"].startswith("Missing API key")
    assert httpx.get(stack.url + "/v1/models", timeout=30).status_code == 401
    assert httpx.get(stack.url + "/health", timeout=30).status_code == 200  # not behind keys
    assert httpx.get(stack.url + "/metrics", timeout=30).status_code == 200


def test_a_key_sees_and_uses_only_its_models(stack: Stack) -> None:
    alice = oai(stack, "sk-alice")
    assert [m.id for m in alice.models.list()] == ["m-both"]
    with pytest.raises(openai.NotFoundError):
        alice.chat.completions.create(model="m-vllm", messages=MESSAGES, max_tokens=2)  # type: ignore[arg-type]
    claude = anthropic.Anthropic(base_url=stack.url, api_key="sk-bob", max_retries=0)  # x-api-key
    answer = claude.messages.create(model="m-vllm", max_tokens=4, messages=MESSAGES)  # type: ignore[arg-type]
    assert answer.content


def test_requests_per_minute_then_429_with_retry_after(stack: Stack) -> None:
    alice = oai(stack, "sk-alice")
    for _ in range(3):  # refused requests (the model the key may not use) did not count
        alice.chat.completions.create(model="m-both", messages=MESSAGES, max_tokens=2)  # type: ignore[arg-type]
    with pytest.raises(openai.RateLimitError) as limited:
        alice.chat.completions.create(model="m-both", messages=MESSAGES, max_tokens=2)  # type: ignore[arg-type]
    assert 1 <= int(limited.value.response.headers["retry-after"]) <= 60
    assert limited.value.code == "rate_limit_exceeded"


def test_concurrent_requests_are_limited_and_released(stack: Stack) -> None:
    body = {"model": "m-vllm", "messages": MESSAGES, "max_tokens": 40, "stream": True}
    headers = {"authorization": "Bearer sk-bob"}
    with httpx.Client(base_url=stack.url, headers=headers, timeout=30) as client:
        stack.taps["vllm"].released.clear()  # the first request stays open until the second was refused
        try:
            with client.stream("POST", "/v1/chat/completions", json=body) as open_stream:
                assert open_stream.status_code == 200
                second = client.post("/v1/chat/completions", json={**body, "stream": False})
                assert second.status_code == 429
                stack.taps["vllm"].released.set()
                open_stream.read()
        finally:
            stack.taps["vllm"].released.set()
        ended(client, "bob")  # the first one's admission ended with it (just after its last bytes)
        again = client.post("/v1/chat/completions", json={**body, "stream": False})
        assert again.status_code == 200


def ended(client: httpx.Client, key: str) -> None:
    """Wait until none of ``key``'s requests is running: a stream's admission is released once it
    has ended, which may be just after the client read its last bytes."""
    deadline = time.monotonic() + 30
    while True:
        keys = client.get("/admin/api/keys", headers=ADMIN).json()["data"]
        running = next(k["running"] for k in keys if k["name"] == key)
        if running == 0:
            return
        if time.monotonic() > deadline:
            raise AssertionError(f"{key} still has {running} requests running")
        time.sleep(0.02)


def test_tokens_per_minute_and_usage_per_key(stack: Stack) -> None:
    carol = anthropic.Anthropic(base_url=stack.url, api_key="sk-carol", max_retries=0)
    carol.messages.create(model="m-llama", max_tokens=30, messages=MESSAGES)  # type: ignore[arg-type]
    with pytest.raises(anthropic.RateLimitError) as limited:
        carol.messages.create(model="m-llama", max_tokens=30, messages=MESSAGES)  # type: ignore[arg-type]
    assert limited.value.body["error"]["type"] == "rate_limit_error"  # type: ignore[index]
    keys = httpx.get(stack.url + "/admin/api/keys", headers=ADMIN, timeout=30).json()["data"]
    usage = {k["name"]: k for k in keys}
    assert usage["carol"]["requests"] == 1
    assert usage["carol"]["prompt_tokens"] > 0
    assert usage["carol"]["last_minute"]["tokens"] >= 20
    assert usage["alice"]["models"] == ["m-both"]
    assert "sk-" not in str(usage)


def test_keys_from_a_file_and_bad_key_entries(tmp_path: Path) -> None:
    path = tmp_path / "keys.toml"
    path.write_text(f'[[keys]]\nname = "dave"\nsha256 = "{hashlib.sha256(b"sk-dave").hexdigest()}"\n')
    settings = load_settings(None, auth={"keys_file": str(path)})
    assert [k.name for k in settings.auth.all_keys()] == ["dave"]
    with pytest.raises(ConfigError, match="give exactly one of sha256 and key"):
        load_settings(None, auth={"keys": [{"name": "x"}]})


def test_two_gateways_on_one_redis_share_a_keys_limits(tmp_path: Path) -> None:
    """Replicas behind a load balancer (``state.url``): a key's requests per minute are counted once;
    with Redis gone each counts them itself, and no request fails for it."""
    server = RedisServer(tmp_path).start()
    keys = {"keys": [{"name": "erin", "key": "sk-erin", "requests_per_minute": 3}]}
    running = start_stack(auth=keys, state={"url": server.url, "prefix": "limits", "timeout_s": 5.0})
    second = ServerThread(create_app(running.settings)).start()
    running.servers.append(second)
    try:
        replicas = [oai(running, "sk-erin"), oai(running, "sk-erin"), oai(second, "sk-erin")]
        for client in replicas:
            client.chat.completions.create(model="m-both", messages=MESSAGES, max_tokens=2)  # type: ignore[arg-type]
        for client in replicas[1:]:  # the fourth, on either
            with pytest.raises(openai.RateLimitError):
                client.chat.completions.create(model="m-both", messages=MESSAGES, max_tokens=2)  # type: ignore[arg-type]
        usage = httpx.get(second.url + "/admin/api/keys", headers=ADMIN, timeout=30).json()["data"][0]
        assert (usage["requests"], usage["last_minute"]["requests"]) == (3, 3)
        server.stop()
        with structlog.testing.capture_logs() as logs:
            answer = replicas[0].chat.completions.create(model="m-both", messages=MESSAGES, max_tokens=2)  # type: ignore[arg-type]
            keys_page = httpx.get(running.url + "/admin/api/keys", headers=ADMIN, timeout=30)
            health = httpx.get(running.url + "/health", timeout=30).json()
        assert answer.choices  # counted in this gateway's memory meanwhile
        assert keys_page.status_code == 200
        assert keys_page.json()["data"][0]["name"] == "erin"
        assert health["state"] == "degraded"
        assert "limits.degraded" in [e["event"] for e in logs]
    finally:
        stop_stack(running)
        server.stop()
