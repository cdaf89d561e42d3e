"""The router and the simulated llama-server agree on the RAM-cache saves (issue #63): on the H100
27B profile (0.54 s a save, 31 us a token held), a session's first turn on its slot after another session's
turns waits for the other slot to be saved, and turnout predicted it; its next turn does not wait and
is not predicted to (``backends.inflight`` marks the slot saved by the launch)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from msgspec.structs import replace

from backends.engine_profiles import load_profile, save_profile
from gateway.replay.fleets import sim_configs
from gateway.replay.synth import template_tokens
from gateway.replay.traces import TraceRequest
from gateway.replay.virtual import GatewayReplay, run_now
from gateway.settings import load_settings

MODEL = "m"
PROFILE = "h100-llamacpp-27b-shape-q8_0-dense"


def turn(t: float, session: str, blocks: range) -> TraceRequest:
    return TraceRequest(t, session, MODEL, 512 * len(blocks), tuple(blocks), 32)


def test_the_predicted_ttft_has_the_save_the_engine_stops_for(tmp_path: Path) -> None:
    built_in = load_profile(PROFILE)
    # the H100 outliers' line, no part per checkpoint held (the checkpoints taken stay in the profile)
    cache = replace(built_in.cache, ram_save_s=0.5425, ram_save_token_s=3.126e-05, ram_save_checkpoint_s=0.0)
    profile = save_profile(replace(built_in, cache=cache), tmp_path / "saves.toml")
    settings = load_settings(
        None,
        profile="cost",
        backends=[{"id": "llama", "kind": "llamacpp", "url": "http://llama.virtual",
                   "engine_profile": str(profile)}],
        models=[{"name": MODEL, "architecture": "hybrid",
                 "deployments": [{"backend": "llama", "upstream_name": MODEL}]}],
    )  # fmt: skip
    requests = [
        turn(0.0, "a", range(1, 5)),
        turn(30.0, "a", range(1, 7)),
        turn(60.0, "a", range(1, 9)),
        turn(90.0, "b", range(101, 105)),  # slot 0 holds a's turns, not saved since they ended
        turn(120.0, "b", range(101, 107)),  # slot 0 was saved when b's first turn began
    ]
    world = GatewayReplay(requests, settings, sim_configs(settings, MODEL))
    results = sorted(world.run(), key=lambda r: r.index)
    assert all(r.ok for r in results), results
    entries: list[dict[str, Any]] = run_now(world.router.store.decisions(20))
    chosen = {}
    for entry in entries:
        index = int(entry["request_id"].removeprefix("r").split(".")[0])
        chosen[index] = next(c for c in entry["candidates"] if c.get("slot") == entry["slot"])
    saves = [chosen[i]["ram_saves_s"] for i in range(5)]
    assert saves[:3] + saves[4:] == [0.0, 0.0, 0.0, 0.0]
    held = 4096 + template_tokens(world.requests[2])  # a's last prompt: 8 blocks in 5 messages
    assert saves[3] == pytest.approx(0.5425 + held * 3.126e-05, abs=1e-3)
    assert {chosen[i]["slot"] for i in (0, 1, 2)} != {chosen[3]["slot"]}  # b has a slot of its own
    first_b = results[3]
    assert first_b.ttft_s == pytest.approx(chosen[3]["predicted_ttft_s"], rel=0.10)
