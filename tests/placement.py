"""What a session's turns through the gateway say about where they ran (``x-turnout-*`` headers)."""

from __future__ import annotations

from collections.abc import Sequence

import httpx


def assert_one_slot(answers: Sequence[httpx.Response]) -> tuple[str, str]:
    """A session's turns after the first ran on one llama.cpp slot, and the first ran there too or
    elsewhere while the gateway warmed that slot for the next turn (``policies.warm``); returns the
    backend and the slot."""
    reasons = [a.headers["x-turnout-route-reason"] for a in answers]
    placed = {(a.headers["x-turnout-backend"], a.headers.get("x-turnout-slot")) for a in answers[1:]}
    assert len(placed) == 1, reasons
    ((backend, slot),) = placed
    assert slot is not None, reasons
    first = (answers[0].headers["x-turnout-backend"], answers[0].headers.get("x-turnout-slot"))
    assert first == (backend, slot) or f"warms {backend} slot {slot} for the next turn" in reasons[0], reasons
    return backend, slot
