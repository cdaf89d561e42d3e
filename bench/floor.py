"""The stack's floor: what uvicorn and aiohttp alone cost per relayed request (issue #15).

    .venv/bin/python bench/floor.py [--port 8486] [--upstream http://127.0.0.1:9000] [--litestar]

A bare ASGI callable on the server turnout runs on (uvicorn with uvloop and httptools, one process)
that sends each POST to the upstream through one aiohttp session (the client turnout's transport
uses) and relays the answer as it comes: status, content type, body chunks. Nothing else: no
framework, no routing, no parsing, no logging, no metrics. ``bench/overhead.py --floor`` runs it
beside turnout and nginx in one harness run, so what turnout adds to the stack it is built on is
measured apart from what the stack itself costs. Loopback only; not a gateway.

``--litestar``: the same relay as one litestar ``@post`` handler (no middleware, no OpenAPI, no
logging), answering with a ``Response`` or, for an event stream, a ``Stream``: the floor of the
framework turnout is built on as well (``bench/overhead.py --floor`` runs both).
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import AsyncIterator, Awaitable, Callable, MutableMapping
from typing import Any

import aiohttp
import uvicorn
from litestar import Litestar, Request, Response, post
from litestar.response import Stream

Scope = MutableMapping[str, Any]
Receive = Callable[[], Awaitable[MutableMapping[str, Any]]]
Send = Callable[[MutableMapping[str, Any]], Awaitable[None]]


class Floor:
    """The relay (module docstring): one upstream session, opened in the serving loop."""

    def __init__(self, upstream: str) -> None:
        self.upstream = upstream.rstrip("/")
        self.session: aiohttp.ClientSession | None = None

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] == "lifespan":
            await self._lifespan(receive, send)
            return
        body = bytearray()
        while True:
            message = await receive()
            body += message.get("body", b"")
            if not message.get("more_body"):
                break
        if self.session is None:
            self.session = aiohttp.ClientSession(
                connector=aiohttp.TCPConnector(limit=0), auto_decompress=False
            )
        async with self.session.post(
            self.upstream + scope["path"], data=bytes(body), headers={"content-type": "application/json"}
        ) as answer:
            kind = answer.headers.get("content-type", "application/json").encode()
            await send(
                {"type": "http.response.start", "status": answer.status, "headers": [(b"content-type", kind)]}
            )
            async for chunk in answer.content.iter_any():
                await send({"type": "http.response.body", "body": chunk, "more_body": True})
        await send({"type": "http.response.body", "body": b""})

    async def _lifespan(self, receive: Receive, send: Send) -> None:
        while True:
            message = await receive()
            if message["type"] == "lifespan.startup":
                await send({"type": "lifespan.startup.complete"})
            elif message["type"] == "lifespan.shutdown":
                if self.session is not None:
                    await self.session.close()
                await send({"type": "lifespan.shutdown.complete"})
                return


def litestar_floor(upstream: str) -> Litestar:
    """The relay as a litestar app (module docstring): what litestar adds to the bare floor."""
    relay = Floor(upstream)

    @post("/{path:path}")
    async def forward(request: Request[Any, Any, Any], path: str) -> Response[bytes] | Stream:
        body = await request.body()
        if relay.session is None:
            relay.session = aiohttp.ClientSession(
                connector=aiohttp.TCPConnector(limit=0), auto_decompress=False
            )
        answer = await relay.session.post(
            relay.upstream + request.url.path, data=body, headers={"content-type": "application/json"}
        )
        kind = answer.headers.get("content-type", "application/json")
        if not kind.startswith("text/event-stream"):
            async with answer:
                return Response(await answer.read(), status_code=answer.status, media_type=kind)

        async def chunks() -> AsyncIterator[bytes]:
            async with answer:
                async for chunk in answer.content.iter_any():
                    yield chunk

        return Stream(chunks(), status_code=answer.status, media_type=kind)

    async def close() -> None:
        if relay.session is not None:
            await relay.session.close()

    return Litestar(route_handlers=[forward], openapi_config=None, on_shutdown=[close])


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--port", type=int, default=8486)
    parser.add_argument("--upstream", default="http://127.0.0.1:9000")
    parser.add_argument("--litestar", action="store_true", help="the relay as a litestar handler")
    args = parser.parse_args(argv)
    app = litestar_floor(args.upstream) if args.litestar else Floor(args.upstream)
    uvicorn.run(app, host="127.0.0.1", port=args.port, log_level="warning", access_log=False)
    return 0


if __name__ == "__main__":
    sys.exit(main())
