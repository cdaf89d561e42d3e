"""turnout as Envoy's Endpoint Picker: a real Envoy (deploy/envoy/envoy.yaml) in front of the
simulated engines, routing by the picker's answer, with learning fed by the response phases."""

from __future__ import annotations

import json
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
from prometheus_client.parser import text_string_to_metric_families

from tests.e2e.conftest import Tap, stack_settings
from tests.epp.envoy import Envoy, PickerThread, envoy_with_picker, simulated_engines


class EppStack:
    def __init__(self, taps: dict[str, Tap], envoy: Envoy, picker: PickerThread) -> None:
        self.taps, self.envoy, self.picker = taps, envoy, picker

    def client(self) -> httpx.Client:
        return httpx.Client(base_url=self.envoy.url, timeout=30)

    def events(self, backend: str) -> list[Any]:
        return list(self.taps[backend].state.sim.events)

    def decisions(self) -> list[dict[str, Any]]:
        return list(self.picker.call(self.picker.core.store.decisions(100)))


@pytest.fixture(scope="module")
def epp(tmp_path_factory: pytest.TempPathFactory) -> Iterator[EppStack]:
    with simulated_engines() as taps:
        settings = stack_settings({name: tap.url for name, tap in taps.items()})
        with envoy_with_picker(settings, tmp_path_factory.mktemp("envoy")) as (envoy, picker):
            yield EppStack(taps, envoy, picker)


def chat(model: str, text: str = "hello there", **extra: Any) -> dict[str, Any]:
    return {"model": model, "messages": [{"role": "user", "content": text}], "max_tokens": 8, **extra}


def test_a_request_goes_through_envoy_to_the_engine_the_picker_chose(epp: EppStack) -> None:
    with epp.client() as client:
        response = client.post("/v1/chat/completions", json=chat("m-llama"))
    assert response.status_code == 200, response.text
    body = response.json()
    assert body["model"] == "m-llama"  # the engine's upstream name, back to the client's
    assert response.headers["x-turnout-backend"] == "llama"
    sent = json.loads(epp.taps["llama"].requests[-1])
    assert sent["model"] == "up-llama"  # the picker sent the engine's request, not the client's


def test_a_stream_goes_through_and_teaches_the_picker(epp: EppStack) -> None:
    with (
        epp.client() as client,
        client.stream(
            "POST",
            "/v1/chat/completions",
            json=chat("m-vllm", stream=True),
            headers={"x-request-id": "epp-stream-1"},
        ) as response,
    ):
        assert response.status_code == 200
        assert response.headers["content-type"].startswith("text/event-stream")
        text = "".join(response.iter_text())
    assert text.rstrip().endswith("data: [DONE]")
    assert '"choices":[]' not in text  # the usage chunk turnout asked for itself is not the client's
    entry = next(d for d in epp.decisions() if d["request_id"] == "epp-stream-1")
    assert entry["chosen"] == "vllm"
    assert entry["outcome"]["ttft_s"] is not None
    assert entry["outcome"]["prompt_tokens"] > 0


def test_a_session_keeps_its_llama_slot_through_envoy(epp: EppStack) -> None:
    history = [{"role": "user", "content": "a long first turn " * 200}]
    headers = {"x-session-id": "epp-session"}
    slots, cached = [], []
    with epp.client() as client:
        for turn in range(3):
            response = client.post(
                "/v1/chat/completions",
                json={"model": "m-llama", "messages": history, "max_tokens": 8},
                headers=headers,
            )
            assert response.status_code == 200, response.text
            slots.append(response.headers["x-turnout-slot"])
            cached.append(response.json()["usage"].get("prompt_tokens_details", {}).get("cached_tokens", 0))
            history += [response.json()["choices"][0]["message"], {"role": "user", "content": f"turn {turn}"}]
    assert len(set(slots)) == 1
    assert cached[1] > 0
    assert cached[2] > cached[1]


def test_the_picker_warms_the_slot_of_a_session_it_sends_to_vllm(epp: EppStack) -> None:
    """Envoy carries the turn to vLLM; the picker itself prefills the prompt into a llama.cpp slot
    (``gateway.warming``), and the session's next turn, through Envoy, finds it there."""
    system = " ".join(f"rule{i % 50} keeps the agent on task" for i in range(700))
    history = [{"role": "system", "content": system}, {"role": "user", "content": "start"}]
    headers = {"x-session-id": "epp-warm"}
    with epp.client() as client:
        first = client.post(
            "/v1/chat/completions",
            json={"model": "m-both", "messages": history, "max_tokens": 200},
            headers=headers,
        )
        assert first.status_code == 200, first.text
        assert first.headers["x-turnout-backend"] == "vllm"
        assert "warms llama slot" in first.headers["x-turnout-route-reason"]
        deadline = time.monotonic() + 30
        while not any(json.loads(body).get("max_tokens") == 1 for body in epp.taps["llama"].requests):
            assert time.monotonic() < deadline, "no warm-up reached llama-server"
            time.sleep(0.05)
        history += [first.json()["choices"][0]["message"], {"role": "user", "content": "next"}]
        second = client.post(
            "/v1/chat/completions",
            json={"model": "m-both", "messages": history, "max_tokens": 8},
            headers=headers,
        )
    assert second.status_code == 200, second.text
    assert second.headers["x-turnout-backend"] == "llama"
    assert second.json()["usage"]["prompt_tokens_details"]["cached_tokens"] > 0


def test_errors_come_back_in_the_clients_api(epp: EppStack) -> None:
    with epp.client() as client:
        unknown = client.post("/v1/chat/completions", json=chat("no-such-model"))
        broken = client.post(
            "/v1/chat/completions", content=b"{not json", headers={"content-type": "application/json"}
        )
        anthropic = client.post(
            "/v1/messages",
            json={"model": "no-such-model", "max_tokens": 8, "messages": [{"role": "user", "content": "hi"}]},
            headers={"anthropic-version": "2023-06-01"},
        )
    assert (unknown.status_code, unknown.json()["error"]["param"]) == (404, "model")
    assert broken.status_code == 400
    assert "not valid JSON" in broken.json()["error"]["message"]
    assert anthropic.status_code == 404
    assert anthropic.json()["type"] == "error"


def test_the_model_list_is_the_pickers_own_answer(epp: EppStack) -> None:
    with epp.client() as client:
        listing = client.get("/v1/models")
        elsewhere = client.get("/v1/whatever")
    assert listing.status_code == 200
    assert {m["id"] for m in listing.json()["data"]} >= {"m-vllm", "m-llama", "m-both"}
    assert elsewhere.status_code == 404


def test_health_and_request_ids_are_the_pickers_answers_through_envoy(epp: EppStack) -> None:
    """Issue #60 item 11: through Envoy, ``/health`` answered 404 model_not_found and no answer carried
    an ``x-request-id``. The picker answers ``/health`` as ``turnout serve`` does, and every answer,
    routed or the picker's own, carries the request's id (the client's, or the one Envoy made)."""
    with epp.client() as client:
        health = client.get("/health")
        routed = client.post("/v1/chat/completions", json=chat("m-llama"), headers={"x-request-id": "mine-1"})
        unknown = client.post("/v1/chat/completions", json=chat("no-such-model"))
        listing = client.get("/v1/models")
    assert health.status_code == 200, health.text
    assert health.json()["status"] == "ok"
    assert set(health.json()["backends"]) == {"vllm", "llama"}
    assert routed.status_code == 200
    assert routed.headers["x-request-id"] == "mine-1"
    for answer in (health, unknown, listing):
        assert len(answer.headers["x-request-id"]) >= 16, answer.headers  # Envoy's, one per request
    assert len({health.headers["x-request-id"], unknown.headers["x-request-id"]}) == 2


def test_envoy_carries_a_large_body(epp: EppStack, tmp_path: Path) -> None:
    """A prompt of several streamed chunks (the picker reads it whole, sends it back in 62 kB
    replies): the engine gets it all."""
    text = "word " * 24_000  # 120 kB, two replies
    with epp.client() as client:
        response = client.post("/v1/chat/completions", json=chat("m-vllm", text))
    assert response.status_code == 200, response.text
    sent = json.loads(epp.taps["vllm"].requests[-1])
    assert sent["messages"][0]["content"] == text


def test_an_anthropic_client_gets_its_api_through_envoy(epp: EppStack) -> None:
    """/v1/messages to a llama.cpp model, pinned to a slot: llama-server's /v1/messages ignores
    ``id_slot``, so the picker sends it to /v1/chat/completions (Envoy rewrites the path) and
    translates the answer Envoy passes back into Anthropic's shape, streamed too."""
    request = {"model": "m-llama", "max_tokens": 8, "messages": [{"role": "user", "content": "hi"}]}
    with epp.client() as client:
        plain = client.post("/v1/messages", json=request, headers={"anthropic-version": "2023-06-01"})
        with client.stream(
            "POST",
            "/v1/messages",
            json={**request, "stream": True},
            headers={"anthropic-version": "2023-06-01"},
        ) as response:
            events = [line for line in response.iter_lines() if line.startswith("event:")]
    assert plain.status_code == 200, plain.text
    assert (plain.json()["type"], plain.json()["model"]) == ("message", "m-llama")
    assert events[0] == "event: message_start"
    assert events[-1] == "event: message_stop"
    path, sent = epp.taps["llama"].posts[-1]
    assert path == "/v1/chat/completions"
    assert json.loads(sent)["id_slot"] in (0, 1)


def llama_requests(epp: EppStack) -> dict[str, float]:
    """The picker's ``turnout_requests_total`` for backend llama, by status (a Prometheus scrape)."""
    scrape = httpx.get(f"http://127.0.0.1:{epp.picker.metrics_port}/metrics", timeout=10)
    assert scrape.status_code == 200
    assert scrape.headers["content-type"].startswith("text/plain")
    counts: dict[str, float] = {}
    for family in text_string_to_metric_families(scrape.text):
        for sample in family.samples:
            if sample.name == "turnout_requests_total" and sample.labels["backend"] == "llama":
                status = sample.labels["status"]
                counts[status] = counts.get(status, 0.0) + sample.value
    return counts


def test_the_pickers_metrics_count_what_the_client_saw(epp: EppStack) -> None:
    """``turnout epp --metrics``: the same Prometheus metrics as turnout serve's, counted from the
    answers Envoy passed back: streamed and plain alike, as many as the client got."""
    before = llama_requests(epp)
    statuses = []
    with epp.client() as client:
        for stream in (False, True, False):
            with client.stream(
                "POST", "/v1/chat/completions", json=chat("m-llama", stream=stream)
            ) as response:
                response.read()
                statuses.append(response.status_code)
        fleet = client.get(f"http://127.0.0.1:{epp.picker.metrics_port}/metrics").text
        missing = client.get(f"http://127.0.0.1:{epp.picker.metrics_port}/nothing")
    assert statuses == [200, 200, 200]
    deadline = time.monotonic() + 10
    after = llama_requests(epp)
    while after.get("200", 0.0) - before.get("200", 0.0) < 3 and time.monotonic() < deadline:
        time.sleep(0.05)  # the last one settles as its last chunk goes back
        after = llama_requests(epp)
    assert after.get("200", 0.0) - before.get("200", 0.0) == 3
    up = {
        s.labels["backend"]: s.value
        for f in text_string_to_metric_families(fleet)
        for s in f.samples
        if s.name == "turnout_backend_up"
    }
    assert up == {"vllm": 1.0, "llama": 1.0}  # the fleet's gauges, from the picker's probes
    assert missing.status_code == 404


def test_envoy_opens_a_connection_per_request_to_the_engines(epp: EppStack) -> None:
    """llama-server closes the connection after every streamed answer without saying so (its answer
    says ``Keep-Alive``); Envoy never reuses an engine connection, so no request goes down one it
    closed (tests/real/test_epp_real.py, on the real llama-server)."""
    counter = "cluster.original_destination_cluster.upstream_cx_max_requests"
    before = epp.envoy.counter(counter)
    with epp.client() as client:
        for model in ("m-llama", "m-vllm", "m-llama"):
            response = client.post("/v1/chat/completions", json=chat(model))
            assert response.status_code == 200, response.text
    assert epp.envoy.counter_after(counter, before + 2) == before + 3
