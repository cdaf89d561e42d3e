"""The fleet's view: probe snapshots plus turnout's own requests sent since each probe."""

from __future__ import annotations

import time

import httpx
import pytest

from backends.base import BackendSpec
from backends.fleet import Fleet
from policies import EngineKind, Health, SlotState


@pytest.fixture
def fleet() -> Fleet:
    specs = [
        BackendSpec("llama", EngineKind.LLAMACPP, "http://127.0.0.1:9"),
        BackendSpec("vllm", EngineKind.VLLM, "http://127.0.0.1:9"),
    ]
    fleet = Fleet(specs, httpx.AsyncClient())
    probed = time.time() - 1
    for snapshot in fleet.snapshots():
        slots = (
            (SlotState(0, 4096, False), SlotState(1, 4096, False))
            if snapshot.kind is EngineKind.LLAMACPP
            else ()
        )
        fleet._store(
            snapshot.__class__(
                snapshot.backend_id, snapshot.kind, Health.READY, probed, slots=slots,
                total_slots=len(slots) or None,
            )
        )  # fmt: skip
    return fleet


def by_id(fleet: Fleet) -> dict[str, object]:
    return {s.backend_id: s for s in fleet.snapshots()}


def test_requests_sent_since_the_probe_count_as_running(fleet: Fleet) -> None:
    first = fleet.begin("llama", 0)
    fleet.begin("llama", 1)
    fleet.begin("llama", None)
    fleet.begin("vllm", None)
    llama, vllm = (s for s in fleet.snapshots())
    assert (llama.running, llama.queued, vllm.running) == (2, 1, 1)
    assert [s.is_processing for s in llama.slots] == [True, True]
    fleet.end(first)
    llama = fleet.snapshots()[0]
    assert [s.is_processing for s in llama.slots] == [False, True]


def test_a_newer_probe_takes_over(fleet: Fleet) -> None:
    fleet.begin("vllm", None)
    snapshot = fleet.snapshots()[1]
    assert snapshot.running == 1
    fleet._store(snapshot.__class__("vllm", EngineKind.VLLM, Health.READY, time.time() + 1, running=1))
    assert fleet.snapshots()[1].running == 1  # the probe's own count, not probe + turnout's
