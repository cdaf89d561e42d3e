"""The replay stack: a simulated vLLM, a simulated llama.cpp and (optionally) a gateway, each a real
uvicorn server on 127.0.0.1 in its own thread.

Time compression: every simulated duration runs ``time_scale`` times faster. The simulators report
llama.cpp ``timings`` in simulated milliseconds, while the gateway measures TTFT and durations on the
wall clock; seen together, llama.cpp would look ``1 / time_scale`` times slower than vLLM to the
gateway's learning. :class:`TimeWarp` therefore multiplies the ``timings`` milliseconds of llama.cpp's
streamed events by ``time_scale`` on their way out, so everything the gateway sees is in wall time.
(The gateway clamps learned rates to 50x their priors: keep ``time_scale`` >= 0.025.)
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from typing import Any

from backends.sim import create_sim_app
from gateway.app import create_app
from gateway.replay.workstation import StackOptions, gateway_settings
from gateway.serving import ServerThread

TIMING_MS_FIELDS = ("prompt_ms", "predicted_ms")
TIMING_RATE_FIELDS = ("prompt_per_second", "predicted_per_second")
TIMING_PER_TOKEN_FIELDS = ("prompt_per_token_ms", "predicted_per_token_ms")


def warp_timings(event: bytes, scale: float) -> bytes:
    """One SSE ``data:`` line with its ``timings`` milliseconds times ``scale`` (rates divided)."""
    if not event.startswith(b"data: {") or b'"timings"' not in event:
        return event
    obj = json.loads(event[6:])
    timings = obj.get("timings")
    if not isinstance(timings, dict):
        return event
    for name in (*TIMING_MS_FIELDS, *TIMING_PER_TOKEN_FIELDS):
        if isinstance(timings.get(name), int | float):
            timings[name] = timings[name] * scale
    for name in TIMING_RATE_FIELDS:
        if isinstance(timings.get(name), int | float) and scale > 0:
            timings[name] = timings[name] / scale
    return b"data: " + json.dumps(obj, separators=(",", ":")).encode()


class TimeWarp:
    """ASGI wrapper of the llama.cpp simulator: ``timings`` of streamed events in wall milliseconds."""

    def __init__(self, app: Any, scale: float) -> None:
        self.app = app
        self.scale = scale

    @property
    def state(self) -> Any:
        return self.app.state

    async def __call__(self, scope: Any, receive: Any, send: Any) -> None:
        if scope["type"] != "http" or self.scale == 1.0:
            await self.app(scope, receive, send)
            return
        streaming = False

        async def warped_send(message: Any) -> None:
            nonlocal streaming
            if message["type"] == "http.response.start":
                headers = dict(message.get("headers") or [])
                streaming = headers.get(b"content-type", b"").startswith(b"text/event-stream")
            elif message["type"] == "http.response.body" and streaming and b'"timings"' in message["body"]:
                lines = message["body"].split(b"\n")
                message = {**message, "body": b"\n".join(warp_timings(line, self.scale) for line in lines)}
            await send(message)

        await self.app(scope, receive, warped_send)


@dataclass
class Stack:
    """Running servers: ``sims`` by backend id, and the gateway when one was asked for."""

    sims: dict[str, ServerThread]
    gateway: ServerThread | None = None
    servers: list[ServerThread] = field(default_factory=list)

    def stop(self) -> None:
        """Stop every server, gateway first."""
        for server in reversed(self.servers):
            server.stop()


def start_stack(options: StackOptions, profile: str | None) -> Stack:
    """Start fresh simulators, and a gateway with ``profile`` unless it is None (the oracle's stack)."""
    configs = options.sim_configs()
    stack = Stack(sims={})
    try:
        for name, config in configs.items():
            app: Any = create_sim_app(config)
            if config.kind == "llamacpp":
                app = TimeWarp(app, options.time_scale)
            server = ServerThread(app).start()
            stack.sims[name] = server
            stack.servers.append(server)
        if profile is not None:
            settings = gateway_settings({n: s.url for n, s in stack.sims.items()}, options, profile)
            stack.gateway = ServerThread(create_app(settings)).start()
            stack.servers.append(stack.gateway)
    except BaseException:
        stack.stop()
        raise
    return stack
