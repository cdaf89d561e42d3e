"""Faults behind Envoy with turnout picking: an engine killed mid-stream, the picker killed (Envoy's
failure mode as configured), the picker back. Engines are simulator processes (SIGKILL-able)."""

from __future__ import annotations

import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from gateway.settings import Settings
from policies import Health
from tests.e2e.conftest import stack_settings
from tests.e2e.processes import SimProcess
from tests.epp.envoy import Envoy, PickerThread, envoy_with_picker

SYSTEM = {"role": "system", "content": "You are a careful coding agent. " * 100}
NO_TIMER_S = 10.0
"""Ended "at once": well before any timer of Envoy's or the picker's would have ended it."""


def ask(
    model: str = "m-both", *, stream: bool, max_tokens: int = 8, session: str = "victim"
) -> dict[str, Any]:
    return {
        "json": {"model": model, "messages": [SYSTEM, {"role": "user", "content": "go"}],
                 "max_tokens": max_tokens, "stream": stream, "ignore_eos": True},
        "headers": {"x-session-id": session},
        "timeout": 30,
    }  # fmt: skip


@pytest.fixture
def sims() -> Iterator[dict[str, SimProcess]]:
    scale = ("--time-scale", "0.2")  # 2,000 tokens take ~4 s: time to kill mid-answer
    running = {
        "vllm": SimProcess("vllm", "up-vllm", "--architecture", "hybrid", *scale),
        "llama": SimProcess("llamacpp", "up-llama", "--slots", "2", *scale),
    }
    for sim in running.values():
        sim.start()
    try:
        yield running
    finally:
        for sim in running.values():
            sim.stop()


def settled(picker: PickerThread, backend: str, count: int = 1) -> list[dict[str, Any]]:
    """The decision log's entries for ``backend`` once it has ``count`` of them (a request cut short
    settles when Envoy closes its stream, a moment after the client saw the end)."""
    deadline = time.monotonic() + NO_TIMER_S
    while True:
        entries = [e for e in picker.call(picker.core.store.decisions(50)) if e["chosen"] == backend]
        if len(entries) >= count or time.monotonic() > deadline:
            return entries
        time.sleep(0.05)


def settings_for(sims: dict[str, SimProcess]) -> Settings:
    return stack_settings({name: sim.url for name, sim in sims.items()})


def test_an_engine_killed_mid_stream_ends_the_stream_at_once_and_the_picker_knows(
    sims: dict[str, SimProcess], tmp_path: Path
) -> None:
    with envoy_with_picker(settings_for(sims), tmp_path) as (envoy, picker):
        for _ in range(2):  # two short turns: the session is pinned to a llama.cpp slot
            warm = httpx.post(envoy.url + "/v1/chat/completions", **ask(stream=False))
            assert warm.status_code == 200, warm.text
        assert warm.headers["x-turnout-backend"] == "llama"
        events: list[str] = []
        broke = False
        with httpx.stream(
            "POST", envoy.url + "/v1/chat/completions", **ask(stream=True, max_tokens=2000)
        ) as response:
            assert response.headers["x-turnout-backend"] == "llama"
            lines = response.iter_lines()
            for line in lines:
                if line.startswith("data:"):
                    events.append(line)
                if len(events) == 3:
                    break
            sims["llama"].kill()
            killed = time.monotonic()
            try:
                events += [line for line in lines if line.startswith("data:")]
            except httpx.HTTPError:
                broke = True  # Envoy reset the client's stream: the answer was cut
            ended = time.monotonic()
        assert ended - killed < NO_TIMER_S
        assert broke or events[-1] != "data: [DONE]"  # the client sees the answer cut, never a clean end
        fleet = picker.core.fleet
        cut = [e for e in settled(picker, "llama", 3) if e["status"] != 200]  # the cut request settles
        assert not fleet.load()  # ...off the fleet
        again = httpx.post(envoy.url + "/v1/chat/completions", **ask(stream=False))
        assert again.status_code == 200, again.text
        assert again.headers["x-turnout-backend"] == "vllm"  # the next request goes elsewhere
        assert [(e["status"], e["error"]) for e in cut] == [(502, "backend llama went away mid-answer")]
        llama = next(s for s in fleet.snapshots() if s.backend_id == "llama")
        assert llama.health is Health.DOWN
        assert picker.call(picker.core.store.leases("llama")) == ()  # the session's lease went with it


def test_the_picker_killed_fails_closed_at_once_and_comes_back(
    sims: dict[str, SimProcess], tmp_path: Path
) -> None:
    """Envoy as deploy/envoy/envoy.yaml configures it (``failure_mode_allow: false``): with the
    picker gone, a request fails at once (never unrouted); a picker back on its port takes over."""
    settings = settings_for(sims)
    picker = PickerThread(settings).start()
    envoy = Envoy(tmp_path, picker.port).start()
    try:
        envoy.picker_healthy()
        assert httpx.post(envoy.url + "/v1/chat/completions", **ask(stream=False)).status_code == 200
        picker.stop()
        started = time.monotonic()
        failed = httpx.post(envoy.url + "/v1/chat/completions", **ask(stream=False))
        assert time.monotonic() - started < NO_TIMER_S
        assert failed.status_code == 500
        error = failed.json()["error"]  # Envoy's own answer, in OpenAI's shape, saying what happened
        assert error["code"] == "picker_unavailable", failed.text
        assert "turnout's endpoint picker did not answer" in error["message"]
        picker = PickerThread(settings, port=picker.port).start()
        envoy.picker_healthy()
        back = httpx.post(envoy.url + "/v1/chat/completions", **ask(stream=False))
        assert back.status_code == 200, back.text
        assert back.headers["x-turnout-backend"] in {"llama", "vllm"}
    finally:
        envoy.stop()
        picker.stop()


def test_the_picker_killed_with_fail_open_sends_requests_on_unrouted(
    sims: dict[str, SimProcess], tmp_path: Path
) -> None:
    """``failure_mode_allow: true`` (InferencePool's FailOpen): Envoy goes on without the picker;
    without a destination header the ORIGINAL_DST cluster has nowhere to go, and Envoy answers at
    once itself: 503, or 500 when it had begun streaming the body to the picker before the
    connection was refused (FULL_DUPLEX_STREAMED cannot take a body back). Fail-open needs a
    fallback route to be of use (docs/epp.md); the shipped config fails closed."""
    with envoy_with_picker(settings_for(sims), tmp_path, fail_open=True) as (envoy, picker):
        assert httpx.post(envoy.url + "/v1/chat/completions", **ask(stream=False)).status_code == 200
        picker.stop()
        started = time.monotonic()
        unrouted = httpx.post(envoy.url + "/v1/chat/completions", **ask(stream=False))
        assert time.monotonic() - started < NO_TIMER_S
        assert unrouted.status_code in (500, 503), (unrouted.headers, unrouted.text)
        assert "x-turnout-backend" not in unrouted.headers  # Envoy's own answer, not an engine's


def test_a_client_that_leaves_mid_stream_is_told_from_a_dead_engine(
    sims: dict[str, SimProcess], tmp_path: Path
) -> None:
    """The stream is cut, the engine still answers its probe: the client left (499), nothing is
    marked down, and the engine stops generating (Envoy closed its connection)."""
    with envoy_with_picker(settings_for(sims), tmp_path) as (envoy, picker):
        request = ask("m-llama", stream=True, max_tokens=2000, session="leaver")
        with httpx.stream("POST", envoy.url + "/v1/chat/completions", **request) as response:
            lines = response.iter_lines()
            assert sum(1 for line, _ in zip(lines, range(6), strict=False) if line.startswith("data:")) >= 2
        fleet = picker.core.fleet
        entries = settled(picker, "llama")
        assert not fleet.load()
        assert [(e["status"], e["error"]) for e in entries] == [
            (499, "the client left before the answer's end")
        ]
        llama = next(s for s in fleet.snapshots() if s.backend_id == "llama")
        assert llama.health is Health.READY
