"""A calibrated profile predicts the real engine: the same agent trace through turnout to the real
llama-server, and in virtual time through turnout to the llama.cpp engine model running that profile.

Two agents, four turns each, alternating on a two-slot server; every turn its conversation grows by
whole blocks (``gateway.replay.synth``: the simulator tokens of each block, mapped one to one onto
real token ids and sent as a token-id prompt, so both engines see the same token sequence). Per turn
the cached tokens must match exactly (slot pinning, context checkpoints, the RAM cache: the engine
model's rules against the engine's) and the TTFTs within 20% at the median (the profile's prices).
"""

from __future__ import annotations

import asyncio
import json
import statistics
import time
from pathlib import Path

import httpx
import pytest

from backends.calibrate.engines import connect
from backends.calibrate.procedure import Options, calibrate
from backends.clock import WALL
from backends.engine_profiles import save_profile
from gateway.app import create_app
from gateway.replay.fleets import sim_configs
from gateway.replay.runner import Result
from gateway.replay.synth import prompt_tokens
from gateway.replay.traces import TraceRequest
from gateway.replay.virtual import GatewayReplay, VirtualOptions
from gateway.settings import Settings, load_settings
from tests.real.llama_server import DEFAULT_ALIAS, LlamaServer, LlamaServerFactory
from tests.servers import ServerThread

pytestmark = [pytest.mark.real_llama, pytest.mark.timeout(600)]

BLOCK = 128
MODEL = "m"
GAP_S = 1.0


def agent_trace() -> list[TraceRequest]:
    requests = []
    for turn in range(4):
        for index, session in enumerate(("a", "b")):
            tokens = 1500 + 600 * turn
            first = 1000 * index
            blocks = -(-tokens // BLOCK)
            requests.append(
                TraceRequest(
                    t=(2 * turn + index) * GAP_S,
                    session=session,
                    model=MODEL,
                    input_tokens=tokens,
                    hash_ids=tuple(range(first, first + blocks)),
                    max_tokens=4,
                )
            )
    return requests


def settings_for(server: LlamaServer, profile: Path) -> Settings:
    return load_settings(
        None,
        backends=[{"id": "llama", "kind": "llamacpp", "url": server.base_url, "engine_profile": str(profile),
                   "probe_interval_s": 0.5, "sim": {"slots": 2}}],
        models=[{"name": MODEL, "architecture": "hybrid", "deployments": [
            {"backend": "llama", "upstream_name": DEFAULT_ALIAS, "context_window": 4096}]}],
    )  # fmt: skip


@pytest.fixture
def calibrated(llama_server: LlamaServerFactory, tmp_path: Path) -> tuple[LlamaServer, Path]:
    server = llama_server(n_parallel=2, ctx_total=8192)

    async def measure() -> Path:
        async with httpx.AsyncClient(base_url=server.base_url, timeout=300) as client:
            engine = await connect(client, seed=3)
            profile = await calibrate(
                engine, Options(name="tiny", budget_s=120), clock=WALL.monotonic, progress=print
            )
        return save_profile(profile, tmp_path / "tiny.toml")

    return server, asyncio.run(measure())


def real_run(settings: Settings, requests: list[TraceRequest]) -> list[tuple[float, int]]:
    """Each request at its time (one after the other), as token ids through turnout: (TTFT, cached)."""
    ids: dict[int, int] = {}
    out = []
    gateway = ServerThread(create_app(settings)).start()
    try:
        with httpx.Client(base_url=gateway.url, timeout=120) as client:
            start = time.monotonic()
            for request in requests:
                time.sleep(max(0.0, start + request.t - time.monotonic()))
                tokens = [ids.setdefault(t, 1000 + len(ids)) for t in prompt_tokens(request, BLOCK)]
                body = {"model": MODEL, "prompt": tokens, "max_tokens": request.max_tokens, "stream": True,
                        "stream_options": {"include_usage": True}}  # fmt: skip
                sent = time.perf_counter()
                ttft, cached = None, -1
                headers = {"x-session-id": request.session or ""}
                with client.stream("POST", "/v1/completions", json=body, headers=headers) as response:
                    assert response.status_code == 200, response.read()
                    for line in response.iter_lines():
                        if not line.startswith("data: ") or line == "data: [DONE]":
                            continue
                        chunk = json.loads(line[6:])
                        if chunk.get("choices") and ttft is None:
                            ttft = time.perf_counter() - sent
                        usage = chunk.get("usage") or {}
                        cached = (usage.get("prompt_tokens_details") or {}).get("cached_tokens", cached)
                assert ttft is not None
                out.append((ttft, cached))
    finally:
        gateway.stop()
    return out


def test_the_profile_predicts_each_turn_of_the_real_engine(calibrated: tuple[LlamaServer, Path]) -> None:
    server, profile = calibrated
    settings = settings_for(server, profile)
    requests = agent_trace()
    real = real_run(settings, requests)
    simulated: list[Result] = GatewayReplay(
        requests, settings, sim_configs(settings, MODEL), VirtualOptions(block_tokens=BLOCK)
    ).run()
    rows = [(r.ttft_s, r.cached_tokens, t, c) for r, (t, c) in zip(simulated, real, strict=True)]
    print("\nturn  sim ttft  real ttft  sim cached  real cached")
    for i, (st, sc, rt, rc) in enumerate(rows):
        print(f"{i:>4}  {st:8.4f}  {rt:9.4f}  {sc:10}  {rc:11}")
    assert [sc for _, sc, _, _ in rows] == [rc for _, _, _, rc in rows]
    errors = [abs(st / rt - 1) for st, _, rt, _ in rows if st is not None]
    assert len(errors) == len(requests)
    assert statistics.median(errors) <= 0.2, errors
