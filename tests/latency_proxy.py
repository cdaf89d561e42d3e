"""A TCP proxy on a free loopback port that holds every reply ``delay`` seconds: a slow network or
server (a Redis under load), for timeout tests. It runs its own event loop in a thread, and keeps
a :class:`Link` per connection: what the client sent, what the server answered, and when
the client hung up (what a gateway does with its upstream connection, seen from outside)."""

from __future__ import annotations

import asyncio
import threading
from dataclasses import dataclass, field

from tests.real.llama_server import free_port


@dataclass
class Link:
    """One proxied connection."""

    sent: bytearray = field(default_factory=bytearray)
    """Everything the client sent through the proxy."""
    answered: bytearray = field(default_factory=bytearray)
    """Everything the server sent through the proxy."""
    client_left: threading.Event = field(default_factory=threading.Event)
    """Set when the client closed its side (the proxy then closes the server's)."""
    answered_when_client_left: bytes = b""


class LatencyProxy:
    def __init__(self, upstream_port: int) -> None:
        self.upstream_port = upstream_port
        self.port = free_port()
        self.delay = 0.0
        self.split_events = False
        """Hold ``delay`` after each server-sent event (a blank line) instead of after each read: the
        events of a stream reach the client one by one, ``delay`` apart, however fast they came."""
        self.links: list[Link] = []
        self._loop = asyncio.new_event_loop()
        self._ready = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def start(self) -> LatencyProxy:
        self._thread.start()
        if not self._ready.wait(10):
            raise RuntimeError("the latency proxy did not start")
        return self

    def stop(self) -> None:
        asyncio.run_coroutine_threadsafe(self._shutdown(), self._loop).result(10)
        self._loop.call_soon_threadsafe(self._loop.stop)
        self._thread.join(10)
        self._loop.close()

    async def _shutdown(self) -> None:
        """Close the listener and end every connection's pipes (nothing left pending in the loop)."""
        self._server.close()
        tasks = [t for t in asyncio.all_tasks() if t is not asyncio.current_task()]
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)

    def _run(self) -> None:
        asyncio.set_event_loop(self._loop)
        self._server = self._loop.run_until_complete(
            asyncio.start_server(self._serve, "127.0.0.1", self.port)
        )
        self._ready.set()
        self._loop.run_forever()

    async def _serve(self, client_in: asyncio.StreamReader, client_out: asyncio.StreamWriter) -> None:
        try:
            server_in, server_out = await asyncio.open_connection("127.0.0.1", self.upstream_port)
        except OSError:
            client_out.close()
            return
        link = Link()
        self.links.append(link)
        await asyncio.gather(
            self._pipe(client_in, server_out, link, upstream=True),
            self._pipe(server_in, client_out, link, upstream=False),
        )

    async def _paced(self, data: bytes, writer: asyncio.StreamWriter) -> None:
        pieces = data.split(b"\n\n")
        for index, piece in enumerate(pieces):
            last = index == len(pieces) - 1
            writer.write(piece if last else piece + b"\n\n")
            await writer.drain()
            if not last:
                await asyncio.sleep(self.delay)

    async def _pipe(
        self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter, link: Link, *, upstream: bool
    ) -> None:
        try:
            while data := await reader.read(65536):
                if upstream:
                    link.sent += data
                else:
                    link.answered += data
                    if self.split_events:
                        await self._paced(data, writer)
                        continue
                    if self.delay:
                        await asyncio.sleep(self.delay)
                writer.write(data)
                await writer.drain()
        except OSError:
            pass
        finally:
            if upstream:
                link.answered_when_client_left = bytes(link.answered)
                link.client_left.set()
            writer.close()
