"""The what-if page's fleet (gateway.admin.whatif): this gateway's routing config as a turnout config,
with what the engines reported and the operator's edits, that ``turnout replay --backends`` loads."""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

import pytest
import tomli_w

from gateway.admin import whatif
from gateway.admin.whatif import WhatIfError
from gateway.api.service import WhatIfEdits as Edits
from gateway.replay.fleets import fleet_from_file, sim_configs
from gateway.settings import Settings, load_settings
from policies.types import BackendSnapshot, Deployment, EngineKind, Health

SECRET = "sk-upstream-secret"


def settings(**over: Any) -> Settings:
    return load_settings(
        None,
        backends=[
            {"id": "vllm", "kind": "vllm", "url": "http://10.0.0.1:8000", "api_key": SECRET},
            {"id": "llama", "kind": "llamacpp", "url": "http://10.0.0.2:8080",
             "sim": {"cache_ram_mib": 4096}},
        ],
        models=[
            {"name": "small", "architecture": "hybrid", "deployments": [
                {"backend": "vllm", "upstream_name": "s", "context_window": 32_768},
                {"backend": "llama", "upstream_name": "s-gguf"}]},
            {"name": "big", "architecture": "moe",
             "deployments": [{"backend": "llama", "upstream_name": "b"}]},
        ],
        groups=[{"name": "both", "members": ["small", "big"]}],
        state={"url": "redis://:hunter2@10.0.0.3:6379/0", "lease_idle_s": 300},
        admin={"token": "admin-secret"},
        **over,
    )  # fmt: skip


def reported(slots: int = 4, window: int = 65_536) -> list[BackendSnapshot]:
    llama = BackendSnapshot(
        "llama",
        EngineKind.LLAMACPP,
        Health.READY,
        0.0,
        deployments=(
            Deployment("small", "llama", "s-gguf", context_window=window),
            Deployment("big", "llama", "b", context_window=window),
        ),
        total_slots=slots,
    )
    return [llama]


def loaded(data: dict[str, Any], tmp_path: Path) -> Settings:
    path = tmp_path / "fleet.toml"
    path.write_text(tomli_w.dumps(data))
    return fleet_from_file(path, "cost")


def test_the_fleet_is_this_gateway_as_the_engines_reported_it_without_secrets(tmp_path: Path) -> None:
    data = whatif.fleet(settings(), reported(), Edits())
    text = tomli_w.dumps(data)
    for secret in (SECRET, "hunter2", "admin-secret"):
        assert secret not in text
    fleet = loaded(data, tmp_path)
    assert [b.id for b in fleet.backends] == ["vllm", "llama"]
    assert fleet.state.lease_idle_s == 300
    assert fleet.state.url is None
    llama = next(b for b in fleet.backends if b.id == "llama")
    assert (llama.sim.slots, llama.sim.cache_ram_mib) == (4, 4096)  # the engine's slots, the config's RAM
    windows = {(d.backend, d.upstream_name): d.context_window for m in fleet.models for d in m.deployments}
    assert windows == {("vllm", "s"): 32_768, ("llama", "s-gguf"): 65_536, ("llama", "b"): 65_536}
    assert [g.name for g in fleet.groups] == ["both"]
    assert sim_configs(fleet, "both")["llama"].slots == 4


def test_edits_remove_copy_and_resize(tmp_path: Path) -> None:
    edits = Edits(remove=["vllm"], copies=["llama"], slots={"llama": 8}, windows={"llama": 131_072})
    fleet = loaded(whatif.fleet(settings(), reported(), edits), tmp_path)
    assert [b.id for b in fleet.backends] == ["llama", "llama-copy"]
    slots = {b.id: b.sim.slots for b in fleet.backends}
    assert slots == {"llama": 8, "llama-copy": 4}  # a copy is the original as the engine reported it
    small = next(m for m in fleet.models if m.name == "small")
    assert [(d.backend, d.context_window) for d in small.deployments] == [
        ("llama", 131_072),
        ("llama-copy", 65_536),
    ]
    assert [g.name for g in fleet.groups] == ["both"]


def test_a_group_left_with_one_member_goes(tmp_path: Path) -> None:
    edits = Edits(remove=["llama"], copies=["vllm", "vllm"])
    fleet = loaded(whatif.fleet(settings(), reported(), edits), tmp_path)
    assert [b.id for b in fleet.backends] == ["vllm", "vllm-copy", "vllm-copy2"]
    assert [m.name for m in fleet.models] == ["small"]
    assert fleet.groups == ()


@pytest.mark.parametrize(
    ("edits", "message"),
    [
        (Edits(remove=["nope"]), "no backend 'nope'"),
        (Edits(remove=["vllm", "llama"]), "leaves nothing"),
        (Edits(slots={"vllm": 2}), "not a llama.cpp backend"),
        (Edits(slots={"llama": 0}), "slots of 'llama': 1 to 64"),
        (Edits(windows={"llama": 10}), "window of 'llama'"),
    ],
)
def test_bad_edits_are_refused_with_the_reason(edits: Edits, message: str) -> None:
    with pytest.raises(WhatIfError, match=message):
        whatif.fleet(settings(), reported(), edits)


def test_the_recording_and_the_window_are_checked(tmp_path: Path) -> None:
    runner = whatif.WhatIf(tmp_path / "none.jsonl")
    config = whatif.fleet(settings(), reported(), Edits())
    with pytest.raises(WhatIfError, match="nothing recorded yet"):
        asyncio.run(runner.run(config, Edits(), ["cost"]))
    with pytest.raises(WhatIfError, match="minutes: 1 to 1440"):
        asyncio.run(runner.run(config, Edits(minutes=0), ["cost"]))
    line = '{"t": 0, "model": "other", "input_tokens": 10, "hash_ids": [0], "max_tokens": 1}\n'
    (tmp_path / "none.jsonl").write_text(line)
    with pytest.raises(WhatIfError, match="serves no model 'other'"):
        asyncio.run(runner.run(config, Edits(), ["cost"]))


def test_one_what_if_at_a_time(tmp_path: Path) -> None:
    runner = whatif.WhatIf(tmp_path / "t.jsonl")
    config = whatif.fleet(settings(), reported(), Edits())

    async def while_one_runs() -> None:
        async with runner._running:
            await runner.run(config, Edits(), ["cost"])

    with pytest.raises(whatif.Busy):
        asyncio.run(while_one_runs())


def test_a_replay_past_its_time_is_stopped(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(whatif, "TIMEOUT_S", 0.05)
    with pytest.raises(WhatIfError, match="longer than 0 s"):
        asyncio.run(whatif._replay(["turnout", "replay", "--help"]))
