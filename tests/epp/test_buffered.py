"""Envoy's BUFFERED body mode (the whole request body in one message, the whole answer in one):
the picker routes as in the protocol's streaming mode, sends the engine's request whole with its
length, and still learns from the answer."""

from __future__ import annotations

import json
from collections.abc import Iterator
from typing import Any

import httpx
import pytest

from tests.e2e.conftest import Tap, stack_settings
from tests.epp.envoy import PickerThread, envoy_with_picker, simulated_engines


class Buffered:
    def __init__(self, url: str, taps: dict[str, Tap], picker: PickerThread) -> None:
        self.url, self.taps, self.picker = url, taps, picker


@pytest.fixture(scope="module")
def buffered(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Buffered]:
    with simulated_engines() as taps:
        settings = stack_settings({name: tap.url for name, tap in taps.items()})
        with envoy_with_picker(settings, tmp_path_factory.mktemp("envoy"), buffered=True) as (envoy, picker):
            yield Buffered(envoy.url, taps, picker)


def chat(model: str, **extra: Any) -> dict[str, Any]:
    return {"model": model, "messages": [{"role": "user", "content": "hello"}], "max_tokens": 8, **extra}


def test_a_request_is_routed_and_answered_in_buffered_mode(buffered: Buffered) -> None:
    response = httpx.post(
        buffered.url + "/v1/chat/completions",
        json=chat("m-llama"),
        headers={"x-request-id": "buf-1"},
        timeout=30,
    )
    assert response.status_code == 200, response.text
    assert (response.json()["model"], response.headers["x-turnout-backend"]) == ("m-llama", "llama")
    sent = json.loads(buffered.taps["llama"].requests[-1])
    assert (sent["model"], sent["id_slot"]) == ("up-llama", int(response.headers["x-turnout-slot"]))
    entries = buffered.picker.call(buffered.picker.core.store.decisions(20))
    entry = next(e for e in entries if e["request_id"] == "buf-1")
    assert entry["outcome"]["completion_tokens"] == 8  # learning read the whole answer


def test_a_stream_comes_back_whole_in_buffered_mode(buffered: Buffered) -> None:
    response = httpx.post(buffered.url + "/v1/chat/completions", json=chat("m-vllm", stream=True), timeout=30)
    assert response.status_code == 200
    assert response.text.rstrip().endswith("data: [DONE]")
    assert '"choices":[]' not in response.text
