"""What the state tests share: one event loop to run them on, a clock they set, the Redis stores'
timeout, and the prompts they send."""

from __future__ import annotations

import asyncio
from collections.abc import Coroutine
from typing import Any


class Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


LOOP = asyncio.new_event_loop()
"""One loop for the state tests: a Redis client belongs to the loop it was made in."""
REDIS_TIMEOUT_S = 5.0
"""The Redis stores' call timeout here: a reply slow on a busy machine is no failure (the default,
0.25 s, is for a gateway, which routes on local state meanwhile)."""


def run(coroutine: Coroutine[Any, Any, Any]) -> Any:
    return LOOP.run_until_complete(coroutine)


SYSTEM = b"shared system prompt and tools " * 200  # ~6 KiB every agent starts with
TURN = SYSTEM + b"agent a: fix the tests " * 100

CHAT_A = SYSTEM + b"chat a: hello " * 160  # 2229 tokens, say: checkpoints at 1713 and 2225
CHAT_B = SYSTEM + b"chat b: other words " * 100  # 3000 tokens
CHAT_C = SYSTEM + b"chat c: a third one " * 100
