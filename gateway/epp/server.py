"""``turnout epp``: the Endpoint Picker's gRPC server (Envoy's ext_proc service and the gRPC health
services the protocol names), on the one running core (``gateway.core.running_core``).

Health: ``liveness`` serves while the process runs; ``readiness``, ``""`` and the ext_proc service
once the engines were probed, and no longer once it drains (SIGTERM, SIGINT): Envoy's health check
then takes its traffic elsewhere, the requests in flight finish within ``grace_s``.

Metrics: with ``metrics`` (``host:port``), ``GET /metrics`` there answers the same Prometheus
metrics as ``turnout serve``'s (docs/metrics.md), from the picker's core: a plain HTTP/1.1 server
on asyncio, one short answer per connection, nothing else on that port.
"""

from __future__ import annotations

import asyncio
import signal
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from dataclasses import dataclass
from functools import partial
from typing import Any

import grpc
import structlog
from envoy.service.ext_proc.v3 import external_processor_pb2_grpc as pb_grpc
from grpc_health.v1 import health, health_pb2, health_pb2_grpc

from backends.clock import WALL, Clock
from gateway.core import Core, fleet_rows, running_core
from gateway.epp import wire
from gateway.epp.exchange import Exchange
from gateway.metrics import CONTENT_TYPE as METRICS_CONTENT_TYPE
from gateway.settings import Settings

log = structlog.get_logger(__name__)

SERVING = health_pb2.HealthCheckResponse.SERVING
NOT_SERVING = health_pb2.HealthCheckResponse.NOT_SERVING


class Picker(pb_grpc.ExternalProcessorServicer):  # type: ignore[misc]
    """Envoy's ext_proc service: one :class:`Exchange` per stream (one HTTP request)."""

    def __init__(self, core: Core, fallbacks: int = 0) -> None:
        self.core, self.fallbacks = core, fallbacks
        self.max_body = core.settings.limits.max_body_bytes

    async def Process(self, request_iterator: Any, context: Any) -> None:
        lock = asyncio.Lock()  # the answer's chunks are written from their own task

        async def write(message: Any) -> None:
            async with lock:
                await context.write(message)

        exchange = Exchange(self.core, write, max_body=self.max_body, fallbacks=self.fallbacks)
        try:
            while (message := await context.read()) is not grpc.aio.EOF:
                await exchange.handle(message)
        finally:
            await exchange.close()


class Health:
    """The gRPC health services of the protocol (``wire.HEALTH_SERVICES``)."""

    def __init__(self) -> None:
        self.servicer = health.aio.HealthServicer()

    async def set(self, ready: bool) -> None:
        for service in wire.HEALTH_SERVICES:
            live = service == "liveness"
            await self.servicer.set(service, SERVING if ready or live else NOT_SERVING)


async def _metrics(core: Core, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
    """One scrape: ``GET /metrics`` answered with the exposition, anything else with 404."""
    try:
        request = await asyncio.wait_for(reader.readuntil(b"\r\n\r\n"), timeout=10)
        line = request.split(b"\r\n", 1)[0].split()
        if len(line) >= 2 and line[0] == b"GET" and line[1].split(b"?")[0] == b"/metrics":
            status, kind, body = (
                b"200 OK",
                METRICS_CONTENT_TYPE.encode(),
                core.metrics.exposition(await fleet_rows(core)),
            )
        else:
            status, kind, body = b"404 Not Found", b"text/plain", b"turnout epp serves GET /metrics here\n"
        writer.write(
            b"HTTP/1.1 "
            + status
            + b"\r\ncontent-type: "
            + kind
            + b"\r\ncontent-length: "
            + str(len(body)).encode()
            + b"\r\nconnection: close\r\n\r\n"
            + body
        )
        await writer.drain()
    except (TimeoutError, asyncio.IncompleteReadError, asyncio.LimitOverrunError, ConnectionError):
        pass  # a scraper that went away, or no HTTP
    finally:
        writer.close()


@dataclass(frozen=True)
class Serving:
    """A picker serving: its gRPC server, the port it listens on, its core."""

    server: grpc.aio.Server
    port: int
    core: Core
    metrics_port: int | None = None


@asynccontextmanager
async def picker_server(
    settings: Settings,
    listen: str,
    clock: Clock = WALL,
    grace_s: float = 5.0,
    metrics: str | None = None,
    fallbacks: int = 0,
) -> AsyncIterator[Serving]:
    """The picker on ``listen`` (``host:port``; port 0: a free one), serving while in the block;
    its Prometheus metrics on ``metrics`` (``host:port``) when given; up to ``fallbacks`` fallback
    endpoints named after each pick (``gateway.epp.fallbacks``)."""
    async with running_core(settings, clock) as core:
        server = grpc.aio.server()
        pb_grpc.add_ExternalProcessorServicer_to_server(Picker(core, fallbacks), server)
        checks = Health()
        health_pb2_grpc.add_HealthServicer_to_server(checks.servicer, server)
        await checks.set(False)
        port = server.add_insecure_port(listen)
        if port == 0:
            raise OSError(f"turnout epp cannot listen on {listen}")
        await server.start()
        scrape, metrics_port = None, None
        if metrics is not None:
            host, _, number = metrics.rpartition(":")
            scrape = await asyncio.start_server(partial(_metrics, core), host or None, int(number))
            metrics_port = scrape.sockets[0].getsockname()[1]
        await checks.set(True)
        log.info(
            "epp.serving", listen=listen, port=port, backends=[s.backend_id for s in core.fleet.snapshots()]
        )
        try:
            yield Serving(server, port, core, metrics_port)
        finally:
            await checks.set(False)
            await server.stop(grace_s)
            if scrape is not None:
                scrape.close()


async def serve_picker(
    settings: Settings,
    listen: str,
    grace_s: float = 5.0,
    metrics: str | None = None,
    fallbacks: int = 0,
) -> None:
    """Run the picker until SIGTERM or SIGINT, then drain (module docstring)."""
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, stop.set)
    async with picker_server(settings, listen, grace_s=grace_s, metrics=metrics, fallbacks=fallbacks):
        await stop.wait()
        log.info("epp.draining", grace_s=grace_s)
