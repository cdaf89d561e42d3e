"""The in-process engine documents are the HTTP simulators' answers: an adapter probing an engine
model through ``EngineDocuments`` gets the snapshot it gets over HTTP, the same token counts, and
``final_usage`` is the usage the gateway's relay reads off the streamed answer."""

from __future__ import annotations

import asyncio
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import httpx
import pytest
from msgspec.structs import replace

from backends.base import BackendSpec
from backends.registry import create_adapter
from backends.sim import SimConfig, create_sim_app
from backends.sim.engine_base import BatchEngine
from backends.sim.inprocess import EngineDocuments, final_usage
from backends.sim.llama_engine import LlamaEngine
from backends.sim.task import SimTask
from backends.sim.vllm_engine import VllmEngine
from backends.stream import ResponseRelay
from gateway.replay.results import request_body
from gateway.replay.traces import TraceRequest
from policies.types import Architecture, BackendSnapshot, Deployment, Endpoint, EngineKind, Usage
from tests.backends.sim.simhelp import WEATHER_TOOL, user, wait_until
from tests.servers import serve

MODEL = "m"
TURNS = (
    TraceRequest(0.0, "s", MODEL, 1300, (1, 2, 3), 12),
    TraceRequest(1.0, "s", MODEL, 2000, (1, 2, 3, 4), 9),  # extends turn 1: reuse on both engines
)
CONFIGS = {
    "vllm": SimConfig(
        kind="vllm", model=MODEL, time_scale=0.001, architecture=Architecture.DENSE, prefix_caching=True
    ),
    "llamacpp": SimConfig(kind="llamacpp", model=MODEL, time_scale=0.001, slots=2),
}
COUNT_BODIES: tuple[tuple[Endpoint, dict[str, Any]], ...] = (
    (Endpoint.CHAT, request_body(TURNS[0])),  # 1300 tokens + 10 of template
    (Endpoint.CHAT, {"messages": [{"role": "system", "content": "be brief"}, user("what is the weather?")]}),
    (Endpoint.CHAT, {"messages": [user("Paris, 3 days")], "tools": [WEATHER_TOOL]}),
    (Endpoint.COMPLETIONS, {"prompt": "def main():\n    return 42\n"}),
    (Endpoint.CHAT, {"messages": "hi"}),  # refused (400): no count
    (Endpoint.CHAT, {"messages": [{"role": "wizard", "content": "hi"}]}),  # refused (400): no count
    (Endpoint.CHAT, {"messages": [user("x")], "tools": {"a": 1}}),  # llama refuses tools not a list
)


class Served:
    """A simulator on a real socket, its engine, and the tasks the engine was handed."""

    def __init__(self, url: str, engine: BatchEngine) -> None:
        self.url = url
        self.engine = engine
        self.tasks: list[SimTask] = []
        submit = engine.submit

        def recording(task: SimTask) -> None:
            self.tasks.append(task)
            submit(task)

        # a spy, not a stub: the engine runs as it would, and the test gets the tasks it finished
        engine.submit = recording  # type: ignore[method-assign]

    def idle(self) -> bool:
        engine = self.engine
        if isinstance(engine, LlamaEngine):
            return not any(slot.busy for slot in engine.slots) and not engine.deferred
        assert isinstance(engine, VllmEngine)
        return not engine.running and not engine.waiting


@contextmanager
def served(kind: str) -> Iterator[Served]:
    app = create_sim_app(CONFIGS[kind])
    with serve(app) as server:
        yield Served(server.url, app.state.sim)


def spec(kind: str, url: str) -> BackendSpec:
    deployment = Deployment(MODEL, "sim", MODEL, architecture=CONFIGS[kind].architecture)
    return BackendSpec("sim", EngineKind(kind), url, deployments=(deployment,))


async def stream_turns(sim: Served) -> list[Usage | None]:
    """Send the turns one after the other as the gateway does (adapter, relay); the usage it read."""
    usages: list[Usage | None] = []
    async with httpx.AsyncClient() as client:
        adapter = create_adapter(spec(sim.engine.config.kind, sim.url), client)
        for turn in TURNS:
            upstream = adapter.prepare(Endpoint.CHAT, request_body(turn), adapter.spec.deployments[0], MODEL)
            response = await adapter.send(upstream)
            try:
                relay = ResponseRelay(upstream, response)
                relay.check_stream()
                async for _ in relay.events():
                    pass
                assert relay.finished
            finally:
                await response.aclose()
            usages.append(relay.usage)
    return usages


async def both_ways(sim: Served) -> tuple[list[BackendSnapshot], list[list[int | None]]]:
    """Probe and count once over HTTP and once in-process: ``[http, inprocess]`` each."""
    snapshots: list[BackendSnapshot] = []
    counts: list[list[int | None]] = []
    async with httpx.AsyncClient() as client:
        for documents in (None, EngineDocuments(sim.engine)):
            adapter = create_adapter(spec(sim.engine.config.kind, sim.url), client, documents=documents)
            snapshots.append(replace(await adapter.probe(), taken_at=0.0))
            deployment = adapter.spec.deployments[0]
            counts.append([await adapter.count_tokens(e, body, deployment) for e, body in COUNT_BODIES])
    return snapshots, counts


@pytest.fixture(params=["vllm", "llamacpp"])
def worked(request: pytest.FixtureRequest) -> Iterator[tuple[Served, list[Usage | None]]]:
    """A simulator that has answered both turns (a slot or the block cache holds them, counters moved)."""
    with served(request.param) as sim:
        usages = asyncio.run(stream_turns(sim))
        assert wait_until(sim.idle)
        yield sim, usages


class TestEngineDocuments:
    def test_probe_snapshot_equals_the_http_one(self, worked: tuple[Served, list[Usage | None]]) -> None:
        """The adapter's snapshot of the engine is the same through either path (``taken_at`` aside)."""
        sim, _ = worked
        (http, inprocess), _ = asyncio.run(both_ways(sim))
        assert inprocess == http
        assert http.health.value == "ready"
        assert http.served_names == (MODEL,)
        assert http.deployments[0].context_window == 32768
        assert http.work_done  # the counters moved: the comparison is not of two empty engines
        if isinstance(sim.engine, LlamaEngine):
            assert (http.total_slots, len(http.slots)) == (2, 2)
        else:
            assert (http.prefix_cache_queries, http.prefix_cache_hits) == (1310 + 2010, 1296)

    def test_token_counts_equal_the_http_ones(self, worked: tuple[Served, list[Usage | None]]) -> None:
        """``count_tokens`` of chat (with and without tools), text and refused bodies: the same through
        either path."""
        sim, _ = worked
        _, (http, inprocess) = asyncio.run(both_ways(sim))
        assert inprocess == http
        assert http[0] == 1310
        assert all(isinstance(n, int) and n > 0 for n in http[1:4])
        assert http[4:6] == [None, None]
        assert (http[6] is None) == isinstance(sim.engine, LlamaEngine)  # llama refuses tools not a list

    def test_small_documents_equal_the_http_bodies(self, worked: tuple[Served, list[Usage | None]]) -> None:
        """The documents the adapters parse, compared raw: the same JSON or text as the HTTP bodies."""
        sim, _ = worked
        paths = ["/props", "/slots"] if isinstance(sim.engine, LlamaEngine) else ["/metrics"]
        documents = EngineDocuments(sim.engine)
        with httpx.Client(base_url=sim.url, timeout=30) as client:
            for path in paths:
                response = client.get(path)
                body = response.json() if path != "/metrics" else response.text
                assert documents(path) == (response.status_code, body), path
            assert documents("/health")[0] == client.get("/health").status_code == 200
            assert documents("/nope")[0] == client.get("/nope").status_code == 404


class TestFinalUsage:
    def test_final_usage_is_what_the_relay_read_off_the_stream(
        self, worked: tuple[Served, list[Usage | None]]
    ) -> None:
        """Per turn, ``final_usage(engine, task)`` equals the relay's usage of that streamed answer."""
        # The tasks come from the HTTP simulator itself (a spy on submit): the same engine state
        # produced both the wire answer and the task, so this compares the two renderings of one
        # finished request, not a re-implementation of the wire functions against themselves.
        sim, relayed = worked
        assert len(sim.tasks) == len(TURNS)
        assert [final_usage(sim.engine, task) for task in sim.tasks] == relayed
        first, second = relayed
        assert first is not None
        assert second is not None
        assert (first.prompt_tokens, first.completion_tokens, first.cached_tokens) == (1310, 12, 0)
        assert (second.prompt_tokens, second.completion_tokens) == (2010, 9)
        if isinstance(sim.engine, LlamaEngine):
            # hybrid: turn 2 diverges at turn 1's tail (token 1303), so the state restored is turn 1's
            # checkpoint at 1310 - 4 - 512 = 794 (the one at 1306 lies past the divergence)
            assert second.cached_tokens == 794
            assert second.prompt_ms is not None
            assert second.prompt_ms > 0
        else:
            assert second.cached_tokens == 1296  # (3 + 1300) tokens shared, in whole 16-token blocks
