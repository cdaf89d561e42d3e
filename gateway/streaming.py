"""Event streams to the client, each watched for the client leaving by one task.

litestar's ``Stream`` sends its body from a task of an anyio task group while the handler's task
waits for ``http.disconnect`` (a second task, cancel scopes, and ~25 more objects alive per open
stream for the garbage collector to walk: with thousands of streams open that is most of what a
full collection costs). :class:`EventStream` sends the body in the response's own task and lets a
:class:`~gateway.disconnect.DisconnectWatch` cancel it when the client leaves: the relay's
iterator sees the same cancellation at the same point, and its ``finally`` closes the upstream.
"""

from __future__ import annotations

import itertools
from collections.abc import Iterable
from typing import TYPE_CHECKING, Any

from litestar.enums import MediaType
from litestar.response import Stream
from litestar.response.base import ASGIResponse
from litestar.response.streaming import ASGIStreamingResponse
from litestar.utils.helpers import get_enum_string_value

from gateway.disconnect import ClientDisconnected, DisconnectWatch

if TYPE_CHECKING:
    from litestar.app import Litestar
    from litestar.background_tasks import BackgroundTask, BackgroundTasks
    from litestar.connection import Request
    from litestar.datastructures.cookie import Cookie
    from litestar.types import Receive, Send, TypeEncodersMap


class WatchedStreamingResponse(ASGIStreamingResponse):
    __slots__ = ()

    async def send_body(self, send: Send, receive: Receive) -> None:
        watch = DisconnectWatch(receive)
        try:
            await watch.run(self._stream(send))
        except ClientDisconnected:
            pass  # the iterator was cancelled where it waited, and closed: the background task runs next
        finally:
            await watch.stop()


class EventStream(Stream):
    """``Stream`` whose body is sent by :class:`WatchedStreamingResponse`."""

    __slots__ = ()

    def to_asgi_response(
        self,
        app: Litestar | None,
        request: Request[Any, Any, Any],
        *,
        background: BackgroundTask | BackgroundTasks | None = None,
        cookies: Iterable[Cookie] | None = None,
        encoded_headers: Iterable[tuple[bytes, bytes]] | None = None,
        headers: dict[str, str] | None = None,
        is_head_response: bool = False,
        media_type: MediaType | str | None = None,
        status_code: int | None = None,
        type_encoders: TypeEncodersMap | None = None,
    ) -> ASGIResponse:
        """As ``Stream.to_asgi_response`` (litestar 2), with the watched response."""
        return WatchedStreamingResponse(
            background=self.background or background,
            content_length=0,
            cookies=self.cookies if cookies is None else itertools.chain(self.cookies, cookies),
            encoded_headers=encoded_headers,
            encoding=self.encoding,
            headers={**headers, **self.headers} if headers is not None else self.headers,
            is_head_response=is_head_response,
            iterator=self.iterator,  # type: ignore[arg-type]  # always an async iterator here
            media_type=get_enum_string_value(media_type or self.media_type or MediaType.JSON),
            status_code=self.status_code or status_code,
        )
