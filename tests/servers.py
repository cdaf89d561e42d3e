"""Run real HTTP servers for tests: an ASGI app on uvicorn in a thread, bound to 127.0.0.1.

Streaming, disconnect and timing tests need a real socket between client and server
(``httpx.ASGITransport`` buffers whole bodies), so every such test goes through here.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

from gateway.serving import ServerThread

__all__ = ["ADMIN", "ADMIN_TOKEN", "ServerThread", "serve"]

ADMIN_TOKEN = "test-admin-token"
"""Every gateway the tests start has this admin token (``tests/conftest.py`` sets TURNOUT_ADMIN__TOKEN)."""
ADMIN = {"authorization": f"Bearer {ADMIN_TOKEN}"}


@contextmanager
def serve(app: Any) -> Iterator[ServerThread]:
    """Serve ``app`` for the duration of a ``with`` block."""
    server = ServerThread(app).start()
    try:
        yield server
    finally:
        server.stop()
