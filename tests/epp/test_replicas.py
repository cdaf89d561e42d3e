"""Two pickers on one Redis, each the picker of its own Envoy (the sidecar layout): a session whose
turns alternate between them stays on one llama.cpp slot, its cache growing turn by turn."""

from __future__ import annotations

import time
import uuid
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from backends.sim import SimConfig, create_sim_app
from tests.e2e.conftest import stack_settings
from tests.epp.envoy import Envoy, PickerThread
from tests.placement import assert_one_slot
from tests.redis_server import RedisServer
from tests.servers import ServerThread

SYSTEM = {"role": "system", "content": "You are a careful coding agent. " * 100}
PATIENCE_S = 15.0


@pytest.fixture
def sims() -> Iterator[dict[str, ServerThread]]:
    configs = {
        "vllm": SimConfig(kind="vllm", model="up-vllm", time_scale=0.02),
        "llama": SimConfig(kind="llamacpp", model="up-llama", time_scale=0.02, slots=2),
    }
    running = {name: ServerThread(create_sim_app(config)).start() for name, config in configs.items()}
    try:
        yield running
    finally:
        for server in running.values():
            server.stop()


def stored(picker: PickerThread, session: str, turns: int) -> None:
    """Wait until ``picker`` sees the session's ``turns``-th turn (stored once its answer ended)."""
    deadline = time.monotonic() + PATIENCE_S
    while time.monotonic() < deadline:
        if any(s.turns >= turns for s in picker.call(picker.core.store.sessions(50))):
            return
        time.sleep(0.02)
    raise AssertionError(f"the picker never saw {turns} turns of {session}")


def probed_after(picker: PickerThread, backend: str, moment: float) -> None:
    """Wait until ``picker`` has probed ``backend`` since ``moment`` (wall clock). A replica does not
    see the other's requests end: a probe it took while the other's turn ran shows the slot busy
    (``backends.inflight``), and on a loaded machine probes come late."""
    deadline = time.monotonic() + PATIENCE_S
    while time.monotonic() < deadline:
        snapshot = next(s for s in picker.core.fleet.snapshots() if s.backend_id == backend)
        if snapshot.taken_at > moment:
            return
        time.sleep(0.02)
    raise AssertionError(f"the picker never probed {backend} again")


def test_two_pickers_over_redis_agree_on_the_slot(
    sims: dict[str, ServerThread], redis_server: RedisServer, tmp_path: Path
) -> None:
    state = {"url": redis_server.url, "prefix": f"epp{uuid.uuid4().hex[:6]}", "timeout_s": 5.0}
    settings = stack_settings({name: s.url for name, s in sims.items()}, state=state)
    pickers = [PickerThread(settings).start(), PickerThread(settings).start()]
    envoys = [Envoy(tmp_path, p.port).start() for p in pickers]
    try:
        for envoy in envoys:
            envoy.picker_healthy()
        history = [SYSTEM]
        answers = []
        for n in range(6):
            history.append({"role": "user", "content": f"Step {n}: " + "look at the tests again. " * 60})
            response = httpx.post(
                envoys[n % 2].url + "/v1/chat/completions",
                json={"model": "m-both", "messages": history, "max_tokens": 8},
                headers={"x-session-id": "shared"},
                timeout=30,
            )
            assert response.status_code == 200, response.text
            answers.append(response)
            history.append(
                {"role": "assistant", "content": response.json()["choices"][0]["message"]["content"]}
            )
            stored(pickers[(n + 1) % 2], "shared", n + 1)  # the other replica has it before the next turn
            probed_after(pickers[(n + 1) % 2], "llama", time.time())  # and knows the slot is free again
    finally:
        for envoy in envoys:
            envoy.stop()
        for picker in pickers:
            picker.stop()
    assert_one_slot(answers)
    cached = [a.json()["usage"]["prompt_tokens_details"]["cached_tokens"] for a in answers]
    prompts = [a.json()["usage"]["prompt_tokens"] for a in answers]
    assert all(c >= 0.9 * p for c, p in zip(cached[1:], prompts, strict=False))  # each turn reused the last
