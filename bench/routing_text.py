"""How the routing benchmark words a comparison: a ratio, and a target met or missed."""

from __future__ import annotations


def ratio(a: float | None, b: float | None) -> str:
    return f"{a / b:.2f}x" if a is not None and b else "n/a"


def verdict(ok: bool) -> str:
    return "MET" if ok else "MISSED"
