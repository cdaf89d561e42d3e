"""Helpers for the simulator tests: run a simulator on a real socket, parse SSE bodies."""

from __future__ import annotations

import json
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any

import httpx

from backends.sim import SimConfig, create_sim_app
from backends.sim.engine_base import BatchEngine
from tests.servers import serve

LONG_TEXT = (
    "Please read the repository layout carefully, then explain which modules handle routing decisions, "
    "how the scorers are weighted, and where the configuration for each backend engine is loaded from. "
)


@contextmanager
def running(kind: str, **overrides: Any) -> Iterator[tuple[httpx.Client, BatchEngine]]:
    """A simulator of ``kind`` on 127.0.0.1 (time_scale 0.001 unless overridden) and a client for it.

    The client's 60 s timeout only bounds a hung test: a request that must not be answered sets its own.
    """
    overrides.setdefault("time_scale", 0.001)
    app = create_sim_app(SimConfig(kind=kind, **overrides))  # type: ignore[arg-type]
    with serve(app) as server, httpx.Client(base_url=server.url, timeout=60) as client:
        yield client, app.state.sim


def sse_data(text: str) -> list[str]:
    """The ``data:`` payloads of an SSE body, in order."""
    return [line[len("data: ") :] for line in text.split("\n") if line.startswith("data: ")]


def sse_json(text: str) -> list[dict[str, Any]]:
    """The JSON ``data:`` payloads (``[DONE]`` excluded)."""
    return [json.loads(d) for d in sse_data(text) if d != "[DONE]"]


def user(text: str) -> dict[str, str]:
    """A user message."""
    return {"role": "user", "content": text}


def wait_until(predicate: Callable[[], bool], timeout: float = 30.0) -> bool:
    """Poll ``predicate`` every 10 ms until true or ``timeout`` seconds passed.

    It returns as soon as the predicate holds, so the generous default costs nothing when the machine
    is idle and keeps a busy one (another job on every core) from failing the test.
    """
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if predicate():
            return True
        time.sleep(0.01)
    return predicate()


WEATHER_TOOL = {
    "type": "function",
    "function": {
        "name": "get_weather",
        "description": "Weather for a city",
        "parameters": {
            "type": "object",
            "properties": {"city": {"type": "string"}, "days": {"type": "integer"}},
            "required": ["city"],
        },
    },
}
