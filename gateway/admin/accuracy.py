"""How far the cost model's predictions are from what happened, per backend, from the decision log.

For each answered request the log keeps the chosen candidate's predicted TTFT and the measured one.
Per backend this gives the ratio actual / predicted (1: exact; 2: took twice as long as predicted):
its median and p90 over the window and over equal slices of it (is learning converging?), and the
points of a scatter on log axes, laid out here so the page only draws them.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping, Sequence
from typing import Any

PLOT_PX = 300
"""Width and height of a scatter's plotting area, in SVG units."""
MAX_DRAWN = 1000
"""The scatter draws at most this many points, the newest (the statistics use every one)."""
MIN_SECONDS = 1e-4
"""Times below this are drawn at it (a log axis has no zero)."""


def percentile(values: Sequence[float], q: float) -> float | None:
    """Nearest rank: the ``ceil(q * n)``-th smallest (as the replay reports use it); None for none."""
    if not values:
        return None
    ordered = sorted(values)
    return ordered[min(max(math.ceil(q * len(ordered)), 1), len(ordered)) - 1]


def _round(value: float | None) -> float | None:
    return None if value is None else round(value, 3)


def pairs(entries: Iterable[Mapping[str, Any]], since: float) -> dict[str, list[tuple[float, float, float]]]:
    """Per backend, ``(at, predicted, actual)`` TTFT of each answered request since ``since``,
    oldest first."""
    out: dict[str, list[tuple[float, float, float]]] = {}
    for entry in entries:
        outcome, backend = entry.get("outcome"), entry.get("chosen")
        if not outcome or backend is None or entry["at"] < since:
            continue
        chosen: Mapping[str, Any] = next((c for c in entry["candidates"] if c["backend"] == backend), {})
        predicted, actual = chosen.get("predicted_ttft_s"), outcome.get("ttft_s")
        if predicted is None or actual is None or predicted <= 0:
            continue
        out.setdefault(backend, []).append((entry["at"], float(predicted), float(actual)))
    for points in out.values():
        points.sort()
    return out


def summary(
    points: Sequence[tuple[float, float, float]], since: float, now: float, slices: int
) -> dict[str, Any]:
    """Ratio statistics of one backend's points, over the window and per slice, and its scatter (of
    the newest ``MAX_DRAWN`` points: more would hide each other and slow the page)."""
    ratios = [actual / predicted for _, predicted, actual in points]
    width = (now - since) / slices if now > since else 1.0
    grouped: list[list[float]] = [[] for _ in range(slices)]
    for (at, _, _), ratio in zip(points, ratios, strict=True):
        grouped[min(max(int((at - since) / width), 0), slices - 1)].append(ratio)
    per_slice = [
        {
            "start": round(since + index * width, 3),
            "requests": len(inside),
            "median": _round(percentile(inside, 0.5)),
            "p90": _round(percentile(inside, 0.9)),
        }
        for index, inside in enumerate(grouped)
    ]
    drawn = points[-MAX_DRAWN:]
    return {
        "requests": len(points),
        "median": _round(percentile(ratios, 0.5)),
        "p90": _round(percentile(ratios, 0.9)),
        "slices": per_slice,
        "drawn": len(drawn),
        "plot": scatter([(p, a) for _, p, a in drawn]),
    }


def scatter(points: Sequence[tuple[float, float]]) -> dict[str, Any]:
    """Pixel positions of ``(predicted, actual)`` on shared log axes (x: predicted, y: actual, up),
    and the ticks (each decade in range) with their positions."""
    if not points:
        return {"points": [], "ticks": [], "size": PLOT_PX}
    logs = [math.log10(max(v, MIN_SECONDS)) for pair in points for v in pair]
    low, high = math.floor(min(logs)), math.ceil(max(logs))
    high = high if high > low else low + 1

    def position(value: float) -> float:
        return round((math.log10(max(value, MIN_SECONDS)) - low) / (high - low) * PLOT_PX, 1)

    return {
        "points": [[position(p), round(PLOT_PX - position(a), 1)] for p, a in points],
        "ticks": [[_decade(exponent), position(10.0**exponent)] for exponent in range(low, high + 1)],
        "size": PLOT_PX,
    }


def _decade(exponent: int) -> str:
    value = 10.0**exponent
    return f"{value:g} s" if value >= 1 else f"{value * 1000:g} ms"
