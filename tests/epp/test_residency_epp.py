"""The Endpoint Picker and a residency set (issue #62; docs/residency.md): the picker never names a
member that is not awake, and a request whose only member is being woken waits for the switch and is
then sent there, as through ``turnout serve`` (the wait lives in the shared lifecycle)."""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator

import httpx
import pytest

from backends.sim import SimConfig, create_sim_app
from gateway.settings import load_settings
from policies import Architecture
from tests.epp.envoy import PickerThread
from tests.epp.test_protocol import Picked, chat, destination
from tests.servers import ServerThread

SCALE = 0.05  # a wake takes 0.06 s, a first sleep 1.4 s: long enough to be inside


@pytest.fixture(scope="module")
def picked() -> Iterator[Picked]:
    config = SimConfig(
        kind="vllm", model="up", time_scale=SCALE, architecture=Architecture.HYBRID, enable_sleep_mode=True
    )
    sims = {name: ServerThread(create_sim_app(config)).start() for name in ("vllm-a", "vllm-b")}
    engine = {"probe_interval_s": 0.2, "timeouts": {"probe": 10}}
    settings = load_settings(
        None,
        backends=[{"id": n, "kind": "vllm", "url": s.url, **engine} for n, s in sims.items()],
        models=[{"name": "m", "architecture": "hybrid",
                 "deployments": [{"backend": n, "upstream_name": "up"} for n in sims]}],
        residency=[{"name": "cards", "members": [{"backend": n} for n in sims], "awake": "vllm-a",
                    "wait_s": 30}],
    )  # fmt: skip
    picker = PickerThread(settings).start()
    try:
        yield Picked(sims, picker)
    finally:
        picker.stop()
        for server in sims.values():
            server.stop()


def sleeping(picked: Picked, backend: str) -> bool:
    return bool(httpx.get(picked.sims[backend].url + "/is_sleeping", timeout=10).json()["is_sleeping"])


def test_the_picker_waits_for_the_member_a_switch_wakes(picked: Picked) -> None:
    deadline = time.monotonic() + 60
    while not sleeping(picked, "vllm-b") and time.monotonic() < deadline:  # the start-up check
        time.sleep(0.05)
    residency = picked.picker.core.residency
    while residency.sets["cards"].current is not None and time.monotonic() < deadline:
        time.sleep(0.05)
    assert destination(picked.exchange(chat("m")))[0] == picked.address("vllm-a")

    loop = picked.picker._loop
    assert loop is not None
    started = threading.Event()

    def switch() -> None:
        residency.start("cards", "vllm-b", "test")
        started.set()

    loop.call_soon_threadsafe(switch)
    assert started.wait(10)
    answers = picked.exchange(chat("m"))  # vllm-a is draining, then asleep: this one waits for vllm-b
    assert destination(answers)[0] == picked.address("vllm-b")
    assert residency.sets["cards"].awake == "vllm-b"
    assert sleeping(picked, "vllm-a")
