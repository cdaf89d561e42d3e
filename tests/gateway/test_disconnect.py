"""``DisconnectWatch``: a disconnect cancels what ``run`` awaits (and nothing else), as
``asyncio.timeout`` does; the end-to-end behaviour is in tests/e2e/test_disconnect.py."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest

from gateway.disconnect import ClientDisconnected, DisconnectWatch


class Client:
    """An ASGI ``receive`` whose ``http.disconnect`` comes when :meth:`leave` is called."""

    def __init__(self) -> None:
        self._left = asyncio.Event()

    async def receive(self) -> dict[str, Any]:
        await self._left.wait()
        return {"type": "http.disconnect"}

    def leave(self) -> None:
        self._left.set()


def cancelling() -> int:
    """How many cancellations of the running task are pending (none left behind by the watch)."""
    current = asyncio.current_task()
    assert current is not None
    return current.cancelling()


async def settle() -> None:
    for _ in range(5):
        await asyncio.sleep(0)


def test_work_that_finishes_gives_its_result() -> None:
    async def main() -> None:
        watch = DisconnectWatch(Client().receive)

        async def work() -> int:
            await asyncio.sleep(0.01)
            return 7

        assert await watch.run(work()) == 7
        assert await watch.run(work()) == 7
        await watch.stop()
        assert not watch.disconnected
        assert cancelling() == 0

    asyncio.run(main())


def test_the_client_leaving_cancels_the_wait() -> None:
    async def main() -> None:
        client, cancelled = Client(), asyncio.Event()
        watch = DisconnectWatch(client.receive)

        async def upstream() -> None:
            try:
                await asyncio.sleep(60)
            except asyncio.CancelledError:
                cancelled.set()
                raise

        asyncio.get_running_loop().call_later(0.01, client.leave)
        with pytest.raises(ClientDisconnected):
            await watch.run(upstream())
        assert cancelled.is_set()
        assert watch.disconnected
        assert cancelling() == 0  # the task goes on, not cancelled
        await asyncio.sleep(0)  # and awaiting still works
        await watch.stop()

    asyncio.run(main())


def test_a_client_gone_before_the_wait_fails_it_at_once() -> None:
    async def main() -> None:
        client = Client()
        watch = DisconnectWatch(client.receive)
        client.leave()
        await settle()
        started = False

        async def work() -> None:
            nonlocal started
            started = True

        with pytest.raises(ClientDisconnected):
            await watch.run(work())
        assert not started  # closed, never run (and no "never awaited" warning)
        await watch.stop()

    asyncio.run(main())


def test_someone_elses_cancellation_stays_a_cancellation() -> None:
    async def main() -> None:
        watch = DisconnectWatch(Client().receive)

        async def handler() -> None:
            await watch.run(asyncio.sleep(60))

        task = asyncio.create_task(handler())
        await settle()
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task
        await watch.stop()

    asyncio.run(main())


def test_a_cancellation_both_ways_is_still_a_cancellation() -> None:
    """The client left and the server cancels the handler too (shutting down): not swallowed."""

    async def main() -> None:
        client = Client()
        watch = DisconnectWatch(client.receive)

        async def handler() -> None:
            await watch.run(asyncio.sleep(60))

        task = asyncio.create_task(handler())
        await settle()
        client.leave()  # the watch wakes next ...
        asyncio.get_running_loop().call_soon(task.cancel)  # ... then this, before the handler runs
        with pytest.raises(asyncio.CancelledError):
            await task
        assert watch.disconnected

    asyncio.run(main())


def test_work_that_swallows_the_cancellation_gives_its_result() -> None:
    async def main() -> None:
        client = Client()
        watch = DisconnectWatch(client.receive)

        async def stubborn() -> str:
            try:
                await asyncio.sleep(60)
            except asyncio.CancelledError:
                return "opened anyway"
            return "slept"

        asyncio.get_running_loop().call_later(0.01, client.leave)
        assert await watch.run(stubborn()) == "opened anyway"
        assert cancelling() == 0  # no cancellation left behind
        await asyncio.sleep(0)
        with pytest.raises(ClientDisconnected):  # the next wait knows the client left
            await watch.run(asyncio.sleep(0))

    asyncio.run(main())
