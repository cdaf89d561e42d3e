"""Run real HTTP servers for tests: an ASGI app on uvicorn in a thread, bound to 127.0.0.1.

Streaming, disconnect and timing tests need a real socket between client and server
(``httpx.ASGITransport`` buffers whole bodies), so every such test goes through here.
"""

from __future__ import annotations

import asyncio
import socket
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import uvicorn


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
        self.loop: asyncio.AbstractEventLoop | None = None

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def _run(self) -> None:
        self.loop = asyncio.new_event_loop()
        asyncio.set_event_loop(self.loop)
        self.loop.run_until_complete(self._server.serve(sockets=[self._sock]))

    def start(self, timeout: float = 15.0) -> ServerThread:
        self._thread.start()
        deadline = time.monotonic() + timeout
        while not self._server.started:
            if not self._thread.is_alive() or time.monotonic() > deadline:
                raise RuntimeError(f"server on port {self.port} did not start")
            time.sleep(0.01)
        return self

    def stop(self) -> None:
        self._server.should_exit = True
        self._thread.join(timeout=10)
        self._sock.close()


@contextmanager
def serve(app: Any) -> Iterator[ServerThread]:
    """Serve ``app`` for the duration of a ``with`` block."""
    server = ServerThread(app).start()
    try:
        yield server
    finally:
        server.stop()
