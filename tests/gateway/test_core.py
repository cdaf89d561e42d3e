"""The one builder: every front end gets the same core from the same settings (``gateway.core``).
The virtual replay used to assemble its own router and left out what only ``create_app`` set (the
redaction of session names, the traffic recorder); the key limits' windows ignored the clock."""

from __future__ import annotations

import asyncio
from pathlib import Path

import httpx

from backends.clock import VirtualClock
from gateway.core import build_core, key_counter, one_replica
from gateway.key_limits.base import Limit, Quota
from gateway.replay.fleets import default_fleet, sim_configs
from gateway.replay.virtual import GatewayReplay
from gateway.settings import Settings

MODEL = "Qwen/Qwen3.5-27B"


def settings(tmp_path: Path, **changes: object) -> Settings:
    base = default_fleet(MODEL, "cost")
    admin = base.admin.model_copy(update={"redact_session_ids": True})
    record = base.record.model_copy(update={"path": tmp_path / "traffic.jsonl", "on_start": True})
    built: Settings = base.model_copy(update={"admin": admin, "record": record, **changes})
    return built


def test_the_builder_applies_every_setting_the_app_did(tmp_path: Path) -> None:
    async def build() -> None:
        async with httpx.AsyncClient() as client:
            core = build_core(settings(tmp_path), VirtualClock(5.0), client=client)
            assert core.router.redact_session_ids
            assert core.router.recorder is not None
            core.router.recorder.close()
            assert core.lifecycle.router is core.router
            assert core.router.clock is core.clock
            assert core.catalog.resolve(MODEL).name == MODEL

    asyncio.run(build())


def test_the_virtual_replay_routes_on_the_same_core_and_never_records_itself(tmp_path: Path) -> None:
    configured = settings(tmp_path)
    replay = GatewayReplay([], configured, sim_configs(configured, MODEL))
    assert replay.router.redact_session_ids  # the drift: set only by create_app before
    assert replay.router.recorder is None  # a replay of a trace writes no trace
    assert not (tmp_path / "traffic.jsonl").exists()


def test_one_replica_drops_the_shared_state_only(tmp_path: Path) -> None:
    configured = settings(tmp_path)
    shared = configured.model_copy(
        update={"state": configured.state.model_copy(update={"url": "redis://127.0.0.1:1/0"})}
    )
    alone = one_replica(shared)
    assert alone.state.url is None
    assert alone.admin == shared.admin
    assert one_replica(configured) is configured


def test_key_limits_count_their_minute_on_the_core_s_clock(tmp_path: Path) -> None:
    clock = VirtualClock(100.0)
    counter = key_counter(settings(tmp_path), clock)
    quota = Quota(requests_per_minute=1)

    async def scenario() -> None:
        assert await counter.admit("k", quota, "r1") is None
        await counter.release("k", "r1", None)
        refusal = await counter.admit("k", quota, "r2")
        assert refusal is not None
        assert refusal.limit is Limit.REQUESTS_PER_MINUTE
        clock.advance_to(161.0)  # a virtual minute later: the window has moved on
        assert await counter.admit("k", quota, "r3") is None

    asyncio.run(scenario())
