"""Where ``turnout calibrate`` measures prefills: the sizes of its cold prompts and of a conversation's
growths (``backends.calibrate.procedure``'s docstring says why these)."""

from __future__ import annotations

DECODE_TOKENS = 24
"""Tokens each decode measurement generates: every prompt leaves room for them."""


def prefill_sizes(window: int, ubatch: int, batch: int) -> list[int]:
    """The cold prefill grid (``procedure``'s docstring), ascending, each under the window."""
    candidates = [
        16,
        ubatch // 2,
        ubatch + 37,
        batch + ubatch // 2 + 11,
        window // 4,
        window // 2,
        window * 9 // 10,
    ]
    limit = window - DECODE_TOKENS - 8
    return sorted({n for n in candidates if 8 <= n <= limit})


def growths(room: int, ubatch: int, batch: int) -> list[int]:
    """Two growths of a conversation that fit ``room`` tokens: half a micro-batch, then a step and a
    half; in a small window, a quarter and a half of the room."""
    wanted = [ubatch // 2 + 3, batch + ubatch // 2 + 11]
    if sum(wanted) > room:
        wanted = [room // 4, room // 2]
    return [g for g in wanted if g >= 8]
