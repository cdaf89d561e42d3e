"""Who held each llama.cpp slot over a window, and vLLM's load beside it: the slot timeline, laid out
here so the page only draws it.

Each answered request to a llama.cpp backend is a bar on its slot's lane, from when it was sent (its
end less its duration) to its end, coloured by its session (one of :data:`COLOURS`, by a hash of
the session's label, so a session keeps its colour across lanes, backends and reloads). A bar marks
an eviction when its request took the slot from another session, and a restore when its prompt came
back from llama-server's RAM prompt cache. A request routed with no slot of its own (a one-off that
llama-server placed itself) goes on the lane ``any``. Requests closer together than a pixel (at 24
h a pixel is 90 s) are drawn as one bar that says how many it holds (:func:`merged`), so a page
never draws more bars than its lanes have pixels. The bars come from the decision log, which
keeps the newest ``state.decision_log_size`` decisions: when the log starts inside the window, the
page says so. vLLM's lane is what the probes saw of its running and waiting requests
(``backends.history``).
"""

from __future__ import annotations

import zlib
from collections.abc import Iterable, Mapping, Sequence
from typing import Any

from backends.history import Bucket

WIDTH_PX = 960
"""Width of a lane's time axis, in SVG units."""
LOAD_PX = 60
"""Height of vLLM's load lane."""
COLOURS = 12
"""Session colours (CSS classes ``c0`` .. ``c11``); a bar with no session is grey (``none``)."""
WINDOWS_MIN = (15, 60, 360, 1440)
"""The windows the page offers (15 min to 24 h); any minutes in between may be asked for."""
STEPS_S = (60, 300, 900, 1800, 3600, 3 * 3600, 6 * 3600)
"""Tick spacings; the smallest that gives at most 8 ticks is used."""


def colour(session: str | None) -> str:
    return "none" if session is None else f"c{zlib.crc32(session.encode()) % COLOURS}"


def _x(at: float, since: float, now: float) -> float:
    return round(min(max((at - since) / (now - since), 0.0), 1.0) * WIDTH_PX, 1)


def bars(entries: Iterable[Mapping[str, Any]], backend: str, since: float, now: float) -> dict[str, Any]:
    """The lanes of one llama.cpp backend: ``{slot: [bar, ...]}`` (slot ``"any"`` for requests
    without one), each bar oldest first."""
    lanes: dict[str, list[dict[str, Any]]] = {}
    for entry in entries:
        outcome = entry.get("outcome")
        if entry.get("chosen") != backend or not outcome:
            continue
        end = float(entry["at"])
        start = end - float(outcome.get("duration_s") or 0.0)
        if end < since or start > now:
            continue
        chosen: Mapping[str, Any] = next((c for c in entry["candidates"] if c["backend"] == backend), {})
        slot = entry.get("slot")
        x = _x(start, since, now)
        session = entry.get("session")
        lanes.setdefault("any" if slot is None else str(slot), []).append(
            {
                "x": x,
                "w": max(round(_x(end, since, now) - x, 1), 1.0),
                "start": round(start, 3),
                "end": round(end, 3),
                "request_id": entry["request_id"],
                "session": session,
                "session_name": entry.get("session_name"),
                "colour": colour(session),
                "evicted": chosen.get("evicts_name") or chosen.get("evicts"),
                "restored": chosen.get("cache_source") == "ram",
                "prompt_tokens": outcome.get("prompt_tokens"),
                "cached_tokens": outcome.get("cached_tokens"),
                "ttft_s": outcome.get("ttft_s"),
                "status": entry.get("status"),
            }
        )
    return {slot: sorted(lane, key=lambda bar: bar["start"]) for slot, lane in lanes.items()}


def merged(lane: Sequence[dict[str, Any]]) -> list[dict[str, Any]]:
    """Bars that start inside the bar drawn before them (they share its pixels: at 24 h a pixel is 90
    s) become one bar of ``requests`` requests, coloured by the session with the most of them, which
    opens the newest one's decision and marks any eviction or restore among them."""
    out: list[dict[str, Any]] = []
    held: list[dict[str | None, list[Any]]] = []  # per drawn bar: session -> [requests, its name]
    for bar in lane:
        last = out[-1] if out else None
        if last is None or bar["x"] >= last["x"] + last["w"]:
            out.append({**bar, "requests": 1, "sessions": 1})
            held.append({bar["session"]: [1, bar["session_name"]]})
            continue
        last["w"] = max(last["w"], round(bar["x"] + bar["w"] - last["x"], 1))
        last["end"] = max(last["end"], bar["end"])
        last["requests"] += 1
        last["evicted"] = last["evicted"] or bar["evicted"]
        last["restored"] = last["restored"] or bar["restored"]
        for key in ("request_id", "prompt_tokens", "cached_tokens", "ttft_s", "status"):
            last[key] = bar[key]  # the newest
        sessions = held[-1]
        mine = sessions.setdefault(bar["session"], [0, bar["session_name"]])
        mine[0] += 1
        last["sessions"] = len(sessions)
        if bar["session"] != last["session"] and mine[0] > sessions[last["session"]][0]:
            last.update(session=bar["session"], session_name=mine[1], colour=colour(bar["session"]))
    return out


def llama_lanes(
    entries: Sequence[Mapping[str, Any]], backend: str, slots: int | None, since: float, now: float
) -> list[dict[str, Any]]:
    """One lane per slot (``slots`` of them when the engine said; else those the log shows), then
    ``any`` if some request had no slot; each labelled with the session that held it last."""
    found = bars(entries, backend, since, now)
    numbered = sorted({*(str(n) for n in range(slots or 0)), *(k for k in found if k != "any")}, key=int)
    names = [*numbered, *(["any"] if "any" in found else [])]
    lanes = []
    for name in names:
        requests = found.get(name, [])
        last = next((bar for bar in reversed(requests) if bar["session"]), None) if name != "any" else None
        lanes.append(
            {
                "slot": name,
                "bars": merged(requests),
                "holder": last["session"] if last else None,
                "holder_name": last["session_name"] if last else None,
                "requests": len(requests),
                "evictions": sum(1 for bar in requests if bar["evicted"]),
                "restores": sum(1 for bar in requests if bar["restored"]),
            }
        )
    return lanes


def load_lane(buckets: Sequence[Bucket], since: float, now: float) -> dict[str, Any]:
    """vLLM's running and waiting requests as two step lines (SVG ``points``), scaled to the most of
    either in the window."""
    top = max((max(b.running, b.queued) for b in buckets), default=0)
    scale = LOAD_PX / max(top, 1)

    def line(values: Sequence[tuple[float, int]]) -> str:
        points: list[str] = []
        for at, value in values:
            y = round(LOAD_PX - value * scale, 1)
            x = _x(at, since, now)
            if points:
                points.append(f"{x},{points[-1].split(',')[1]}")  # hold the last value up to here
            points.append(f"{x},{y}")
        return " ".join(points)

    return {
        "running": line([(b.start, b.running) for b in buckets]),
        "queued": line([(b.start, b.queued) for b in buckets]),
        "most": top,
        "samples": len(buckets),
        "height": LOAD_PX,
    }


def ticks(since: float, now: float) -> list[tuple[float, float]]:
    """``(epoch, x)`` of each tick, at a round spacing giving at most 8."""
    span = now - since
    step = next((s for s in STEPS_S if span / s <= 8), STEPS_S[-1])
    first = (since // step + 1) * step
    return [(at, _x(at, since, now)) for at in _range(first, now, step)]


def _range(first: float, last: float, step: float) -> Iterable[float]:
    at = first
    while at <= last:
        yield at
        at += step
