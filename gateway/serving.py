"""Serving turnout: the gateway in the foreground (``turnout serve``, ``turnout demo``), or any ASGI
app on uvicorn in a daemon thread, bound to a free 127.0.0.1 port.

The thread is used by ``turnout replay`` (simulators and gateways in one process) and by the tests
that need a real socket between client and server (``httpx.ASGITransport`` buffers whole bodies).
"""

from __future__ import annotations

import asyncio
import gc
import socket
import threading
import time
from pathlib import Path
from types import FrameType
from typing import Any

import structlog
import uvicorn

from gateway.settings import Settings

log = structlog.get_logger(__name__)


class ServerThread:
    """A uvicorn server for one ASGI app, in a daemon thread, on a free loopback port."""

    def __init__(self, app: Any) -> None:
        self._sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        self._sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        self._sock.bind(("127.0.0.1", 0))
        self.port: int = self._sock.getsockname()[1]
        config = uvicorn.Config(
            app, log_level="warning", lifespan="on", loop="asyncio", timeout_graceful_shutdown=2
        )
        self._server = uvicorn.Server(config)
        self._thread = threading.Thread(target=self._run, name=f"uvicorn-{self.port}", daemon=True)

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def _run(self) -> None:
        asyncio.run(self._server.serve(sockets=[self._sock]))

    def start(self, timeout: float = 15.0) -> ServerThread:
        """Start serving; raises ``RuntimeError`` when the server is not up within ``timeout``."""
        self._thread.start()
        deadline = time.monotonic() + timeout
        while not self._server.started:
            if not self._thread.is_alive() or time.monotonic() > deadline:
                raise RuntimeError(f"server on port {self.port} did not start")
            time.sleep(0.01)
        return self

    def stop(self) -> None:
        """Ask the server to exit and wait for its thread."""
        self._server.should_exit = True
        self._thread.join(timeout=10)
        self._sock.close()


class GracefulServer(uvicorn.Server):
    """uvicorn that drains the gateway before it stops. SIGTERM (or a first Ctrl-C): new requests
    get 503 and ``/health`` says ``draining`` (a load balancer moves on), requests in flight finish
    within ``grace_s``, streams still running then end with their API's error event
    (``Relay.drain``), and the process exits 0. A second signal stops it at once."""

    def __init__(self, config: uvicorn.Config, app: Any, grace_s: float) -> None:
        super().__init__(config)
        self.app = app
        self.grace_s = grace_s
        self._draining: asyncio.Task[None] | None = None

    def handle_exit(self, sig: int, frame: FrameType | None) -> None:
        relay = getattr(self.app.state, "relay", None)
        if self._draining is not None or relay is None:  # a second signal, or nothing to drain yet
            self.should_exit, self.force_exit = True, self._draining is not None
            return
        loop = asyncio.get_event_loop()  # the signal handler runs in the loop's (main) thread
        self._draining = loop.create_task(self._drain(relay))

    async def _drain(self, relay: Any) -> None:
        log.warning("gateway.draining", grace_s=self.grace_s)
        await relay.drain(self.grace_s)
        log.info("gateway.drained")
        self.should_exit = True


FULL_COLLECTION_EVERY = 100
"""Young-generation collections between two full ones (Python's default: 10)."""


def settle_heap() -> None:
    """Set the cyclic garbage collector up for a server (docs/decisions.md; "Garbage collection" in
    docs/benchmarks.md has the measurements):

    - what start-up built (modules, the app, its routes, models and schemas: most of the heap) is
      frozen (``gc.freeze``), so no collection walks it again: full collections under load went
      from ~72 to ~17 ms (p50), the c1 p99 from 6.7 to 2.0 ms;
    - full collections come after ``FULL_COLLECTION_EVERY`` middle-generation ones instead of 10:
      each walks every object alive, ~0.4-0.5 s with 5,000 streams open, and every request and
      stream waits meanwhile (14 in a 4-minute soak at 10, 1 at 100). Almost all garbage is freed
      by reference counting the moment it is dropped; only reference cycles wait for a collection.
    """
    gc.collect()
    gc.freeze()
    young, middle, _ = gc.get_threshold()
    gc.set_threshold(young, middle, FULL_COLLECTION_EVERY)


def run_gateway(settings: Settings, log_file: Path | None = None) -> None:
    """Serve the gateway in the foreground until SIGINT/SIGTERM (drained first: ``GracefulServer``);
    ``log_file``: every log line there, only warnings and worse on stderr."""
    from gateway.app import create_app
    from gateway.logging import configure_logging

    configure_logging(settings.log_format, settings.log_level, log_file)
    app = create_app(settings)
    config = uvicorn.Config(
        app,
        host=settings.host,
        port=settings.port,
        log_level="warning",
        access_log=False,
        timeout_graceful_shutdown=5,
        limit_concurrency=settings.limits.max_connections,
        timeout_keep_alive=settings.limits.keep_alive_s,
    )
    settle_heap()
    GracefulServer(config, app, settings.limits.shutdown_grace_s).run()
