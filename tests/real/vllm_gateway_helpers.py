"""What tests/real/test_vllm_gateway.py builds on: the served names and window of its real vLLM, the
gateway (profile ``cost``) it runs in front of it, a direct probe, the engine's /metrics, and readers
of the gateway's log lines and streamed events."""

from __future__ import annotations

import time
from collections.abc import Iterator, MutableMapping
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any

import httpx
from litestar import Litestar

from backends.base import BackendSpec
from backends.parsers.prometheus import parse_samples, sum_by_name
from backends.vllm import VllmAdapter
from gateway.app import create_app
from gateway.settings import Settings, load_settings
from policies import Deployment, EngineKind, Health
from policies.learning import DeploymentStats
from tests.real.vllm_server import VllmServer
from tests.servers import ServerThread

UPSTREAM = "tiny-qwen3next"
MODEL = "tiny"
BACKEND = "vllm"
MAX_MODEL_LEN = 4096  # the tiny model's max_position_embeddings: room for a long answer to abort
CONFIGURED_BLOCK_SIZE = 32


@dataclass
class Gateway:
    server: ServerThread
    app: Litestar

    @property
    def url(self) -> str:
        return self.server.url

    def learned(self) -> DeploymentStats:
        stats: DeploymentStats = self.app.state.core.router.learned.deployments[f"{BACKEND}/{MODEL}"]
        return stats


PROBE_TIMEOUT_S = 30.0
"""These tests read what a probe parses, not how fast: a real engine busy on a 2-core machine may be
slow to answer (the gateway's own 2 s probe timeout would call it down)."""


def spec(url: str) -> BackendSpec:
    deployment = Deployment(MODEL, BACKEND, UPSTREAM, context_window=8192)
    return BackendSpec(
        BACKEND, EngineKind.VLLM, url, deployments=(deployment,), probe_timeout=PROBE_TIMEOUT_S
    )


async def probe(url: str) -> Any:
    async with httpx.AsyncClient() as client:
        return await VllmAdapter(spec(url), client).probe()


def metrics(server: VllmServer) -> dict[str, float]:
    return sum_by_name(parse_samples(httpx.get(server.base_url + "/metrics", timeout=30).text))


@contextmanager
def running_gateway(url: str) -> Iterator[Gateway]:
    """A gateway (profile ``cost``) whose only backend is the vLLM at ``url``, ready once probed."""
    settings = load_settings(
        None,
        profile="cost",
        backends=[
            {
                "id": BACKEND,
                "kind": "vllm",
                "url": url,
                "probe_interval_s": 0.2,
                "timeouts": {"probe": PROBE_TIMEOUT_S},  # vLLM on two busy cores answers probes slowly
            }
        ],
        models=[
            {
                "name": MODEL,
                "architecture": "hybrid",
                "deployments": [{"backend": BACKEND, "upstream_name": UPSTREAM}],
            }
        ],
    )
    app = create_app(settings)
    server = ServerThread(app).start()
    try:
        deadline = time.monotonic() + 10
        while time.monotonic() < deadline:  # the first probe sets the context window from /v1/models
            snapshots = app.state.core.fleet.snapshots()
            if snapshots and snapshots[0].health is Health.READY:
                break
            time.sleep(0.05)
        yield Gateway(server, app)
    finally:
        server.stop()


def completed(
    logs: list[MutableMapping[str, Any]], count: int, within_s: float = 30.0
) -> list[MutableMapping[str, Any]]:
    deadline = time.monotonic() + within_s
    while time.monotonic() < deadline:
        lines = [e for e in logs if e["event"] == "request.completed"]
        if len(lines) >= count:
            return lines
        time.sleep(0.01)
    return [e for e in logs if e["event"] == "request.completed"]


def data_events(raw: bytes) -> list[str]:
    return [line[6:] for line in raw.decode().splitlines() if line.startswith("data: ")]


def group_settings(vllm_url: str, llama_url: str, llama_alias: str) -> Settings:
    """Model group ``grp``: ``m-vllm`` (27B-like) on the vLLM at ``vllm_url``, its default member, and
    ``m-llama`` (80B-like) on the llama-server at ``llama_url``; profile ``cost``."""
    return load_settings(
        None,
        profile="cost",
        backends=[
            {"id": "vllm", "kind": "vllm", "url": vllm_url, "probe_interval_s": 0.2,
             "timeouts": {"probe": PROBE_TIMEOUT_S}},
            {"id": "llama", "kind": "llamacpp", "url": llama_url, "probe_interval_s": 0.2,
             "timeouts": {"probe": PROBE_TIMEOUT_S}},
        ],
        models=[
            {"name": "m-vllm", "architecture": "hybrid", "params_total_b": 27,
             "deployments": [{"backend": "vllm", "upstream_name": UPSTREAM}]},
            {"name": "m-llama", "architecture": "hybrid", "params_total_b": 80,
             "deployments": [{"backend": "llama", "upstream_name": llama_alias}]},
        ],
        groups=[{"name": "grp", "members": ["m-vllm", "m-llama"]}],
    )  # fmt: skip
