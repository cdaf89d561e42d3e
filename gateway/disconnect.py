"""Watching for the client going away while the gateway waits on an engine.

llama-server sends no headers for a queued streaming request until a slot takes it, and a
non-streamed request sends nothing until it is done: in both waits only ``http.disconnect`` on
the ASGI ``receive`` channel says the client left. :class:`DisconnectWatch` reads it in the
background, and while :meth:`DisconnectWatch.run` awaits a wait, a disconnect cancels the task that
awaits it (as ``asyncio.timeout`` does): the upstream request is cancelled at once, and a wait
costs no task of its own.
"""

from __future__ import annotations

import asyncio
from collections.abc import Coroutine
from typing import Any, TypeVar

from litestar.types import Receive

T = TypeVar("T")


class ClientDisconnected(Exception):
    """The client closed its connection before the response was complete."""


class DisconnectWatch:
    """Reads ``receive`` in the background until ``http.disconnect``; use after the body is read."""

    def __init__(self, receive: Receive) -> None:
        self.disconnected = False
        self._waiting: asyncio.Task[Any] | None = None  # the task inside ``run``, while it awaits
        self._cancelled = False  # ... and the watch cancelled it
        self._task: asyncio.Task[None] = asyncio.create_task(self._watch(receive))

    async def _watch(self, receive: Receive) -> None:
        while (await receive())["type"] != "http.disconnect":
            pass
        self.disconnected = True
        if self._waiting is not None:
            self._cancelled = True
            self._waiting.cancel()

    async def run(self, work: Coroutine[Any, Any, T]) -> T:
        """Await ``work`` unless the client leaves first; then cancel it and raise. ``work`` that
        finishes although the client left (it swallowed the cancellation) gives its result."""
        if self.disconnected:
            work.close()
            raise ClientDisconnected
        task = self._waiting = asyncio.current_task()
        assert task is not None
        try:
            return await work
        except asyncio.CancelledError:
            if self._cancelled:
                self._cancelled = False
                if task.uncancel() == 0:  # nobody else cancelled the task
                    raise ClientDisconnected from None
            raise
        finally:
            if self._cancelled:  # ``work`` swallowed our cancellation and finished: take it back
                task.uncancel()
            self._waiting, self._cancelled = None, False

    async def stop(self) -> None:
        """Stop reading ``receive`` (a streaming response listens to it itself)."""
        if self._task.done():
            return
        self._task.cancel()
        try:
            await self._task
        except asyncio.CancelledError:
            current = asyncio.current_task()
            if current is not None and current.cancelling():  # the caller is being cancelled too
                raise
