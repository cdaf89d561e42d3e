"""The slot timeline's layout (gateway.admin.slots) and the probes' load history (backends.history)."""

from __future__ import annotations

import asyncio
import itertools
import time
from typing import Any

import pytest
from litestar.testing import TestClient

from backends.history import LoadHistory
from gateway.admin import slots
from gateway.app import create_app
from gateway.settings import load_settings
from policies.types import BackendSnapshot, EngineKind, Health
from tests.servers import ADMIN, ADMIN_TOKEN

NOW = 10_000.0
SINCE = NOW - 900.0  # a 15-minute window: 960 px for 900 s


def entry(
    request_id: str,
    end: float,
    duration: float,
    slot: int | None,
    session: str | None = "s-a",
    backend: str = "llama",
    evicts: str | None = None,
    source: str = "slot",
) -> dict[str, Any]:
    return {
        "at": end,
        "request_id": request_id,
        "session": session,
        "session_name": None if session is None else f"name-{session}",
        "chosen": backend,
        "slot": slot,
        "status": 200,
        "candidates": [
            {"backend": "vllm", "evicts": None, "cache_source": "none"},
            {"backend": backend, "evicts": evicts, "cache_source": source},
        ],
        "outcome": {"duration_s": duration, "prompt_tokens": 1000, "cached_tokens": 900, "ttft_s": 0.4},
    }


def test_each_answered_request_is_a_bar_on_its_slot_from_sent_to_ended() -> None:
    entries = [
        entry("r3", NOW - 100, 50, 1, "s-b"),
        entry("r2", NOW - 300, 90, 0, "s-a"),
        entry("r1", NOW - 600, 90, 0, "s-a"),
    ]  # newest first, as the log keeps them
    lanes = slots.llama_lanes(entries, "llama", 2, SINCE, NOW)
    assert [lane["slot"] for lane in lanes] == ["0", "1"]
    zero = lanes[0]["bars"]
    assert [bar["request_id"] for bar in zero] == ["r1", "r2"]  # oldest first
    assert zero[0]["x"] == round((NOW - 690 - SINCE) / 900 * slots.WIDTH_PX, 1)
    assert zero[0]["w"] == round(90 / 900 * slots.WIDTH_PX, 1)
    assert (lanes[0]["holder"], lanes[0]["holder_name"]) == ("s-a", "name-s-a")
    assert lanes[1]["holder"] == "s-b"
    assert zero[0]["colour"] == zero[1]["colour"] == slots.colour("s-a")


def test_evictions_restores_and_requests_without_a_slot_are_marked() -> None:
    entries = [
        entry("back", NOW - 10, 5, 0, "s-a", evicts="s-c", source="ram"),
        entry("thief", NOW - 200, 5, 0, "s-c", evicts="s-a"),
        entry("one-off", NOW - 300, 5, None, None),
        entry("first", NOW - 400, 5, 0, "s-a"),
    ]
    lanes = slots.llama_lanes(entries, "llama", 1, SINCE, NOW)
    assert [lane["slot"] for lane in lanes] == ["0", "any"]
    zero, anywhere = lanes
    assert [(b["request_id"], b["evicted"], b["restored"]) for b in zero["bars"]] == [
        ("first", None, False),
        ("thief", "s-a", False),
        ("back", "s-c", True),
    ]
    assert (zero["evictions"], zero["restores"], zero["holder"]) == (2, 1, "s-a")
    assert anywhere["holder"] is None
    assert anywhere["bars"][0]["colour"] == "none"


def test_only_this_backend_answered_requests_inside_the_window_are_drawn() -> None:
    entries = [
        entry("other", NOW - 50, 5, 0, backend="llama-2"),
        {**entry("failed", NOW - 60, 5, 0), "outcome": None},
        entry("before", SINCE - 10, 5, 0),
        entry("straddles", SINCE + 10, 60, 0),
        entry("tiny", NOW - 1, 0.01, 0),
    ]
    lanes = slots.llama_lanes(entries, "llama", None, SINCE, NOW)
    bars = {bar["request_id"]: bar for bar in lanes[0]["bars"]}
    assert set(bars) == {"straddles", "tiny"}
    assert bars["straddles"]["x"] == 0.0  # clipped to the window's start
    assert bars["tiny"]["w"] == 1.0  # still visible


def test_lanes_come_from_the_engine_slot_count_even_when_idle() -> None:
    lanes = slots.llama_lanes([], "llama", 3, SINCE, NOW)
    assert [(lane["slot"], lane["bars"], lane["holder"]) for lane in lanes] == [
        ("0", [], None),
        ("1", [], None),
        ("2", [], None),
    ]


def test_a_session_keeps_its_colour() -> None:
    assert slots.colour("4a772dd931ba") == slots.colour("4a772dd931ba")
    assert {slots.colour(f"s{n}") for n in range(200)} == {f"c{n}" for n in range(slots.COLOURS)}
    assert slots.colour(None) == "none"


def test_ticks_are_round_and_at_most_eight() -> None:
    for minutes in slots.WINDOWS_MIN:
        since = NOW - minutes * 60
        ticks = slots.ticks(since, NOW)
        assert 1 <= len(ticks) <= 8
        steps = {round(b[0] - a[0]) for a, b in itertools.pairwise(ticks)}
        assert len(steps) <= 1
        assert all(at % 60 == 0 for at, _ in ticks)
        assert all(0 <= x <= slots.WIDTH_PX for _, x in ticks)


def snapshot(at: float, running: int, queued: int, health: Health = Health.READY) -> BackendSnapshot:
    return BackendSnapshot("vllm", EngineKind.VLLM, health, at, running=running, queued=queued)


def test_the_load_history_keeps_the_most_per_bucket_of_ready_probes() -> None:
    history = LoadHistory(bucket_s=10, kept_s=60)
    history.add(snapshot(100.0, 3, 0))
    history.add(snapshot(104.0, 1, 5))
    history.add(snapshot(112.0, 2, 1))
    history.add(snapshot(115.0, 9, 9, Health.DOWN))  # a down engine's counts mean nothing
    history.add(snapshot(101.0, 7, 7))  # a clock that went back adds nothing
    assert [(b.start, b.running, b.queued) for b in history.since("vllm", 0)] == [(100, 3, 5), (110, 2, 1)]
    assert [b.start for b in history.since("vllm", 115)] == [110]
    for at in range(120, 300, 10):
        history.add(snapshot(float(at), 1, 0))
    assert len(history.since("vllm", 0)) == 6  # the newest kept_s only
    assert history.since("llama", 0) == []


def test_the_load_lane_steps_through_the_buckets() -> None:
    history = LoadHistory(bucket_s=10)
    for at, running, queued in [(SINCE, 2, 0), (SINCE + 450, 4, 1)]:
        history.add(snapshot(at, running, queued))
    lane = slots.load_lane(history.since("vllm", SINCE), SINCE, NOW)
    assert lane["most"] == 4
    assert lane["samples"] == 2
    height = slots.LOAD_PX
    assert lane["running"] == f"0.0,{height / 2} 480.0,{height / 2} 480.0,0.0"
    assert lane["queued"] == f"0.0,{float(height)} 480.0,{float(height)} 480.0,{height * 3 / 4}"
    assert slots.load_lane([], SINCE, NOW)["running"] == ""


def test_the_page_says_where_a_full_log_starts() -> None:
    """The log keeps the newest ``state.decision_log_size`` decisions: when it is full and starts
    inside the window, the older bars are missing, and the page says from when it draws."""
    settings = load_settings(
        None,
        backends=[{"id": "llama", "kind": "llamacpp", "url": "http://127.0.0.1:9", "probe_interval_s": 3600}],
        models=[{"name": "m", "deployments": [{"backend": "llama", "upstream_name": "m"}]}],
        state={"decision_log_size": 5},
        admin={"token": ADMIN_TOKEN},
    )
    app = create_app(settings)
    with TestClient(app) as client:
        now = time.time()

        async def fill(count: int) -> None:
            for n in range(count):
                await app.state.core.router.store.record_decision(entry(f"r{n}", now - 300 + n * 10, 5, 0))

        asyncio.run(fill(4))
        assert client.get("/admin/api/slots", headers=ADMIN).json()["log_from"] is None  # not full
        asyncio.run(fill(8))  # r0-r7 again: the newest five are r3-r7
        data = client.get("/admin/api/slots", headers=ADMIN).json()
        assert data["log_from"] == pytest.approx(now - 300 + 30)
        bars = data["backends"][0]["lanes"][0]["bars"]
        assert [bar["request_id"] for bar in bars] == ["r3", "r4", "r5", "r6", "r7"]


def test_requests_sharing_a_pixel_are_drawn_as_one_bar() -> None:
    """A day is 960 pixels (90 s each): six 5-second turns 10 s apart would overlap; they are one
    bar of six requests, in the colour of the session with most of them, opening the newest."""
    now, since = NOW, NOW - 24 * 3600
    entries = [
        entry(f"r{n}", now - 400 + n * 10, 5, 0, "s-b" if n == 2 else "s-a", evicts="s-z" if n == 1 else None)
        for n in range(6)
    ][::-1]
    entries.append(entry("old", now - 20_000, 5, 0, "s-c"))
    (lane,) = slots.llama_lanes(entries, "llama", 1, since, now)
    old, day = lane["bars"]
    assert (old["requests"], old["request_id"]) == (1, "old")
    assert (day["requests"], day["sessions"], day["request_id"]) == (6, 2, "r5")
    assert (day["session"], day["colour"], day["session_name"]) == ("s-a", slots.colour("s-a"), "name-s-a")
    assert day["evicted"] == "s-z"
    assert (lane["requests"], lane["evictions"]) == (7, 1)
    assert len(slots.llama_lanes(entries, "llama", 1, now - 900, now)[0]["bars"]) == 6  # 15 min: apart
