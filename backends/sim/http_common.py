"""HTTP plumbing shared by both simulator apps: JSON/SSE encoding, body reading, disconnect races."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Awaitable
from typing import Any, TypeVar

import msgspec
from litestar import Request, Response
from litestar.types import Receive

from backends.sim.engine_base import BatchEngine
from backends.sim.generation import cut, plan_output
from backends.sim.requests import GenRequest
from backends.sim.task import SimTask, Update, UpdateKind

T = TypeVar("T")
_encoder = msgspec.json.Encoder()
SSE_HEADERS = {"Cache-Control": "no-cache", "X-Accel-Buffering": "no"}


def sse(obj: Any) -> bytes:
    """One server-sent event ``data: <json>\\n\\n``."""
    return b"data: " + _encoder.encode(obj) + b"\n\n"


def json_response(obj: Any, status: int = 200, media_type: str = "application/json") -> Response[bytes]:
    """A JSON response encoded with msgspec (key order preserved, compact)."""
    return Response(_encoder.encode(obj), status_code=status, media_type=media_type)


async def read_json(request: Request[Any, Any, Any]) -> Any:
    """The decoded JSON body; raises ``msgspec.DecodeError`` on malformed JSON."""
    return msgspec.json.decode(await request.body())


async def wait_disconnect(receive: Receive) -> None:
    """Return once the client has gone (``http.disconnect``); call only after the body was read."""
    while True:
        message = await receive()
        if message["type"] == "http.disconnect":
            return


async def unless_disconnected(request: Request[Any, Any, Any], work: Awaitable[T]) -> tuple[bool, T | None]:
    """Await ``work`` unless the client leaves first: ``(True, result)`` or ``(False, None)``.

    The disconnect watcher is cancelled before returning, so a streaming response can listen next.
    """
    job = asyncio.ensure_future(work)
    watcher = asyncio.ensure_future(wait_disconnect(request.receive))
    try:
        await asyncio.wait({job, watcher}, return_when=asyncio.FIRST_COMPLETED)
    finally:
        watcher.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await watcher
    if job.done():
        return True, job.result()
    job.cancel()
    with contextlib.suppress(asyncio.CancelledError):
        await job
    return False, None


async def collect(task: SimTask) -> Update:
    """Wait for the task's last update (DONE or ERROR), discarding tokens."""
    while True:
        update = await task.outbox.get()
        if update.kind in (UpdateKind.DONE, UpdateKind.ERROR):
            return update


def new_task(engine: BatchEngine, req: GenRequest, number: int, cap: int) -> SimTask:
    """A task for ``req``: its deterministic answer cut to the request's (or default) budget and ``cap``."""
    budget = req.max_tokens if req.max_tokens is not None else engine.config.default_max_tokens
    budget = cap if budget is None else min(budget, cap)
    plan = plan_output(
        engine.config.seed,
        req.prompt,
        req.tool if engine.config.tool_calls or req.named_tool else None,
        ignore_eos_until=budget if req.ignore_eos else None,
        reasoning_tokens=engine.config.reasoning_tokens,
    )
    return SimTask(
        id=f"req-{number}",
        number=number,
        prompt=req.prompt,
        answer=cut(plan, max(budget, 0)),
        id_slot=req.id_slot,
        cache_prompt=req.cache_prompt,
        user_start=req.user_start,
        first_user=req.first_user,
    )
