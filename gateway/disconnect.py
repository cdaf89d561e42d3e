"""Watching for the client going away while the gateway waits on an engine.

llama-server sends no headers for a queued streaming request until a slot takes it, and a
non-streamed request sends nothing until it is done: in both waits only ``http.disconnect`` on
the ASGI ``receive`` channel says the client left. :class:`DisconnectWatch` races each wait
against it, so the upstream request is cancelled at once.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Awaitable
from typing import TypeVar

from litestar.types import Receive

T = TypeVar("T")


class ClientDisconnected(Exception):
    """The client closed its connection before the response was complete."""


class DisconnectWatch:
    """Reads ``receive`` in the background until ``http.disconnect``; use after the body is read."""

    def __init__(self, receive: Receive) -> None:
        self._task: asyncio.Task[None] = asyncio.create_task(self._wait(receive))

    @staticmethod
    async def _wait(receive: Receive) -> None:
        while True:
            message = await receive()
            if message["type"] == "http.disconnect":
                return

    @property
    def disconnected(self) -> bool:
        return self._task.done() and not self._task.cancelled()

    async def run(self, work: Awaitable[T]) -> T:
        """Await ``work`` unless the client leaves first; then cancel it and raise."""
        future = asyncio.ensure_future(work)
        try:
            await asyncio.wait({future, self._task}, return_when=asyncio.FIRST_COMPLETED)
        finally:
            if not future.done():
                future.cancel()
                with contextlib.suppress(asyncio.CancelledError, Exception):
                    await future
        if future.cancelled():
            raise ClientDisconnected
        return future.result()

    async def stop(self) -> None:
        """Stop reading ``receive`` (a streaming response listens to it itself)."""
        self._task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await self._task
