"""A llama-server that clears idle slots (``--kv-unified`` with ``--cache-idle-slots``), seen by the
probe (``backends.slot_watch``) on the simulated llama-server, which clears them as the real one does
(the real one: tests/real/test_llama_slot_watch.py)."""

from __future__ import annotations

import asyncio
import time

import httpx
import pytest

from backends.sim import SimConfig, create_sim_app
from backends.slot_watch import CLEARED_IDLE_SLOTS, cleared_while_idle
from gateway.app import create_app
from gateway.core import build_core, one_replica
from gateway.settings import Settings, load_settings
from policies.types import BackendSnapshot, SlotState
from tests.servers import ADMIN, serve


def slot(id_: int, task: int | None, tokens: int | None, busy: bool = False) -> SlotState:
    return SlotState(id_, 2048, busy, task=task, tokens=tokens)


@pytest.mark.parametrize(
    ("before", "now", "cleared"),
    [
        (slot(0, 3, 162), slot(0, 3, 0), [0]),  # idle, same task, emptied: the server cleared it
        (slot(0, 3, 162), slot(0, 4, 0), []),  # a new task of its own
        (slot(0, 3, 162), slot(0, 3, 0, busy=True), []),  # working now
        (slot(0, 3, 162, busy=True), slot(0, 3, 0), []),  # was working
        (slot(0, 3, 0), slot(0, 3, 0), []),  # held nothing
        (slot(0, None, None), slot(0, None, None), []),  # never used (or an engine that does not say)
        (slot(0, 3, 162), slot(0, 3, 162), []),  # kept
    ],
)
def test_cleared_while_idle(before: SlotState, now: SlotState, cleared: list[int]) -> None:
    assert cleared_while_idle([before], [now]) == cleared


def settings_over(llama_url: str, probe_interval_s: float) -> Settings:
    return load_settings(
        None,
        backends=[
            {"id": "llama", "kind": "llamacpp", "url": llama_url, "probe_interval_s": probe_interval_s}
        ],
        models=[
            {
                "name": "m",
                "architecture": "hybrid",
                "deployments": [{"backend": "llama", "upstream_name": "sim"}],
            }
        ],
    )


def pinned(client: httpx.Client, id_slot: int, words: str) -> None:
    body = {"prompt": words, "max_tokens": 2, "id_slot": id_slot, "cache_prompt": True}
    assert client.post("/v1/completions", json={"model": "sim", **body}).status_code == 200


@pytest.mark.parametrize("unified", [True, False])
def test_the_probe_says_when_slots_are_cleared(unified: bool) -> None:
    """A pinned request on slot 0, a probe, one on slot 1, a probe: with a unified KV cache slot 0 was
    cleared while idle, and the backend's snapshot carries the warning with the fix from then on."""
    engine = SimConfig(kind="llamacpp", model="sim", slots=2, kv_unified=unified, time_scale=0.001)

    async def probes(url: str) -> list[BackendSnapshot]:
        async with httpx.AsyncClient() as http:
            core = build_core(one_replica(settings_over(url, 3600)), client=http, record=False)
            seen = []
            with httpx.Client(base_url=url, timeout=10) as client:
                for id_slot, words in ((0, "one two three four five six"), (1, "seven eight nine ten")):
                    pinned(client, id_slot, words)
                    seen += await core.fleet.probe_all()
            seen += await core.fleet.probe_all()  # and it stays said
            return seen

    with serve(create_sim_app(engine)) as llama:
        first, second, third = asyncio.run(probes(llama.url))
    expected = (CLEARED_IDLE_SLOTS,) if unified else ()
    assert (first.warnings, second.warnings, third.warnings) == ((), expected, expected)


def test_health_and_the_overview_show_the_warning() -> None:
    engine = SimConfig(kind="llamacpp", model="sim", slots=2, kv_unified=True, time_scale=0.001)
    with serve(create_sim_app(engine)) as llama, serve(create_app(settings_over(llama.url, 0.05))) as gateway:
        with httpx.Client(base_url=llama.url, timeout=10) as client:
            pinned(client, 0, "one two three four five six")
            time.sleep(0.5)  # probes see slot 0 holding it
            pinned(client, 1, "seven eight nine ten")
        deadline = time.monotonic() + 10
        while time.monotonic() < deadline:
            health = httpx.get(gateway.url + "/health").json()
            if health["warnings"]:
                break
            time.sleep(0.05)
        overview = httpx.get(gateway.url + "/admin/api/overview", headers=ADMIN).json()
    assert health["warnings"] == {"llama": [CLEARED_IDLE_SLOTS]}
    assert overview["backends"][0]["warnings"] == [CLEARED_IDLE_SLOTS]
