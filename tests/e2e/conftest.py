"""A whole stack on loopback: simulated engines and the gateway, each a real server in a thread."""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any

import httpx
import pytest

from backends.sim import SimConfig, create_sim_app
from gateway.app import create_app
from gateway.settings import Settings, load_settings
from policies import Architecture
from tests.servers import ServerThread


class Tap:
    """ASGI wrapper that records every response body an app sends, per request path."""

    def __init__(self, app: Any) -> None:
        self.app = app
        self.bodies: list[tuple[str, bytes]] = []
        self.requests: list[bytes] = []
        self.posts: list[tuple[str, bytes]] = []  # every POST (counting calls too): path, request body
        self.released = threading.Event()  # while clear, answers to /v1/ POSTs hold back their last bytes
        self.released.set()

    async def __call__(self, scope: Any, receive: Any, send: Any) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        sent: list[bytes] = []
        received: list[bytes] = []
        recorded = False
        tapped = scope["method"] == "POST" and scope["path"].startswith("/v1/")  # not the probes

        def record() -> None:
            nonlocal recorded
            if scope["method"] == "POST" and not recorded:
                self.posts.append((scope["path"], b"".join(received)))
            if tapped and not recorded:
                self.bodies.append((scope["path"], b"".join(sent)))
                self.requests.append(b"".join(received))
            recorded = True

        async def tap_receive() -> Any:
            message = await receive()
            if message["type"] == "http.request":
                received.append(message.get("body", b""))
            return message

        async def tap_send(message: Any) -> None:
            if message["type"] == "http.response.body":
                sent.append(message.get("body", b""))
                if not message.get("more_body", False):
                    if tapped and not self.released.is_set():  # a test keeps this request open
                        await asyncio.to_thread(self.released.wait, 60)
                    record()  # before the last bytes leave: the client cannot finish reading first
            await send(message)

        try:
            await self.app(scope, tap_receive, tap_send)
        finally:
            record()

    @property
    def state(self) -> Any:
        return self.app.state


@dataclass
class Stack:
    gateway: ServerThread
    sims: dict[str, ServerThread]
    taps: dict[str, Tap]
    settings: Settings
    servers: list[ServerThread] = field(default_factory=list)
    app: Any = None
    """The gateway's Litestar app (its ``state.core``: the router a test may feed)."""

    @property
    def url(self) -> str:
        return self.gateway.url

    def events(self, backend: str) -> list[Any]:
        return list(self.taps[backend].state.sim.events)

    def client(self, **kwargs: Any) -> httpx.Client:
        return httpx.Client(base_url=self.gateway.url, timeout=30, **kwargs)


PROBE_TIMEOUT_S = 10.0


def stack_settings(
    urls: dict[str, str],
    extra_backends: list[dict[str, Any]] | None = None,
    extra_models: list[dict[str, Any]] | None = None,
    timeouts: dict[str, float] | None = None,
    **over: Any,
) -> Settings:
    # probes every 0.2 s, each given 10 s (the default 2 s would call a busy machine's engine down)
    engine = {"probe_interval_s": 0.2, "timeouts": {"probe": PROBE_TIMEOUT_S, **(timeouts or {})}}
    backends = [  # extra backends first: ties go to configured order, so they are tried first
        *(extra_backends or []),
        {"id": "vllm", "kind": "vllm", "url": urls["vllm"], **engine},
        {"id": "llama", "kind": "llamacpp", "url": urls["llama"], **engine},
    ]
    models = [
        {
            "name": "m-vllm",
            "architecture": "hybrid",
            "deployments": [{"backend": "vllm", "upstream_name": "up-vllm"}],
        },
        {
            "name": "m-llama",
            "architecture": "moe",
            "deployments": [{"backend": "llama", "upstream_name": "up-llama"}],
        },
        {
            "name": "m-both",
            "aliases": ["both"],
            "architecture": "hybrid",  # as the simulators are
            "deployments": [
                {"backend": "vllm", "upstream_name": "up-vllm"},
                {"backend": "llama", "upstream_name": "up-llama"},
            ],
        },
        *(extra_models or []),
    ]
    return load_settings(None, backends=backends, models=models, **over)


def start_stack(
    vllm: SimConfig | None = None,
    llama: SimConfig | None = None,
    extra_backends: list[dict[str, Any]] | None = None,
    extra_models: list[dict[str, Any]] | None = None,
    timeouts: dict[str, float] | None = None,
    **over: Any,
) -> Stack:
    configs = {
        "vllm": vllm
        or SimConfig(kind="vllm", model="up-vllm", time_scale=0.002, architecture=Architecture.HYBRID),
        "llama": llama or SimConfig(kind="llamacpp", model="up-llama", time_scale=0.002, slots=2),
    }
    taps = {name: Tap(create_sim_app(config)) for name, config in configs.items()}
    sims = {name: ServerThread(tap).start() for name, tap in taps.items()}
    settings = stack_settings(
        {n: s.url for n, s in sims.items()}, extra_backends, extra_models, timeouts, **over
    )
    app = create_app(settings)
    gateway = ServerThread(app).start()
    return Stack(gateway, sims, taps, settings, [gateway, *sims.values()], app)


def stop_stack(stack: Stack) -> None:
    for server in stack.servers:
        server.stop()


@pytest.fixture(scope="module")
def stack() -> Iterator[Stack]:
    """One gateway over a vLLM simulator and a llama.cpp simulator (2 slots), shared by a module."""
    running = start_stack()
    try:
        yield running
    finally:
        stop_stack(running)
