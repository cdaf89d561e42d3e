"""``EventStream``: litestar's ``Stream`` sent from the response's own task, one watch for the client
leaving (no task group); the relay's streams end to end are in tests/e2e."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from typing import Any

from litestar.background_tasks import BackgroundTask

from gateway.streaming import EventStream, WatchedStreamingResponse


class Client:
    """ASGI ``send``/``receive`` of a client that leaves after ``leave_after`` body chunks."""

    def __init__(self, leave_after: int | None = None) -> None:
        self.sent: list[dict[str, Any]] = []
        self.leave_after = leave_after
        self._left = asyncio.Event()

    async def send(self, message: dict[str, Any]) -> None:
        self.sent.append(message)
        chunks = sum(1 for m in self.sent if m["type"] == "http.response.body")
        if self.leave_after is not None and chunks >= self.leave_after:
            self._left.set()

    async def receive(self) -> dict[str, Any]:
        await self._left.wait()
        return {"type": "http.disconnect"}


def respond(events: AsyncIterator[bytes], client: Client, finished: list[str]) -> None:
    async def finish() -> None:
        finished.append("background")

    stream = EventStream(events, media_type="text/event-stream", background=BackgroundTask(finish))
    response = stream.to_asgi_response(None, None)  # type: ignore[arg-type]  # litestar 2 ignores both here
    assert isinstance(response, WatchedStreamingResponse)

    async def main() -> None:
        await response({"type": "http"}, client.receive, client.send)  # type: ignore[arg-type]
        assert len(asyncio.all_tasks()) == 1  # the watch stopped with the response

    asyncio.run(main())


def test_every_event_then_the_end_then_the_background_task() -> None:
    finished: list[str] = []

    async def events() -> AsyncIterator[bytes]:
        for n in range(3):
            await asyncio.sleep(0)
            yield b"data: %d\n\n" % n

    client = Client()
    respond(events(), client, finished)
    assert client.sent[0]["type"] == "http.response.start"
    assert [m["body"] for m in client.sent[1:]] == [b"data: 0\n\n", b"data: 1\n\n", b"data: 2\n\n", b""]
    assert [m["more_body"] for m in client.sent[1:]] == [True, True, True, False]
    assert finished == ["background"]


def test_a_client_that_leaves_cancels_the_relay_where_it_waits() -> None:
    """The iterator is cancelled at its wait for the engine and closed (its ``finally`` closes the
    upstream response); nothing more is sent; the background task (learning, the log line) runs."""
    finished: list[str] = []

    async def events() -> AsyncIterator[bytes]:
        try:
            yield b"data: first\n\n"
            await asyncio.sleep(60)  # the engine is slow to send more
            yield b"data: never\n\n"
        except asyncio.CancelledError:
            finished.append("cancelled")
            raise
        finally:
            finished.append("closed")

    client = Client(leave_after=1)
    respond(events(), client, finished)
    assert [m["body"] for m in client.sent[1:]] == [b"data: first\n\n"]
    assert finished == ["cancelled", "closed", "background"]
