"""API keys through Envoy with turnout picking: a wrong key is refused (401) and a key over its
limit shed (429 with retry-after), each in the client's API, by the same counters as turnout serve."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from backends.sim import SimConfig, create_sim_app
from tests.e2e.conftest import stack_settings
from tests.epp.envoy import Envoy, envoy_with_picker
from tests.servers import ServerThread

CHAT = {"model": "m-both", "messages": [{"role": "user", "content": "hello"}], "max_tokens": 4}


@pytest.fixture(scope="module")
def envoy(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Envoy]:
    sims = {
        "vllm": ServerThread(
            create_sim_app(SimConfig(kind="vllm", model="up-vllm", time_scale=0.002))
        ).start(),
        "llama": ServerThread(
            create_sim_app(SimConfig(kind="llamacpp", model="up-llama", time_scale=0.002, slots=2))
        ).start(),
    }
    auth = {"keys": [{"name": "alice", "key": "sk-alice", "requests_per_minute": 2}]}
    settings = stack_settings({n: s.url for n, s in sims.items()}, auth=auth)
    directory: Path = tmp_path_factory.mktemp("envoy")
    try:
        with envoy_with_picker(settings, directory) as (running, _picker):
            yield running
    finally:
        for sim in sims.values():
            sim.stop()


def test_a_wrong_key_is_refused_in_the_clients_api(envoy: Envoy) -> None:
    openai = httpx.post(
        envoy.url + "/v1/chat/completions", json=CHAT, headers={"authorization": "Bearer sk-x"}
    )
    anthropic = httpx.post(
        envoy.url + "/v1/messages",
        json={**CHAT, "max_tokens": 4},
        headers={"x-api-key": "sk-x", "anthropic-version": "2023-06-01"},
    )
    assert (openai.status_code, openai.json()["error"]["type"]) == (401, "invalid_request_error")
    assert (anthropic.status_code, anthropic.json()["error"]["type"]) == (401, "authentication_error")


def test_a_key_over_its_limit_is_shed_with_a_429(envoy: Envoy) -> None:
    headers = {"authorization": "Bearer sk-alice"}
    answers = [httpx.post(envoy.url + "/v1/chat/completions", json=CHAT, headers=headers) for _ in range(3)]
    assert [a.status_code for a in answers] == [200, 200, 429]
    shed = answers[-1]
    assert shed.json()["error"]["code"] == "rate_limit_exceeded"
    assert (
        "requests_per_minute" in shed.json()["error"]["message"]
        or "requests" in shed.json()["error"]["message"]
    )
