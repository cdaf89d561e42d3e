"""What routing bought: per hour, the time to first token the chosen backends saved against sending
every request to one backend, from the decision log.

When a request was routed, every candidate backend was priced: its predicted TTFT, with the load as it
was. Against the alternative "everything to backend B", a request answered by another backend saved
``B's price x B's correction - the measured TTFT``, where B's correction is the median actual /
predicted TTFT of the requests B answered in the window (``gateway.admin.accuracy``; 1 when it
answered none: ``corrections`` lists those it has). A request B answered saved nothing against B. A request B
was no candidate for (too long for its window, a model it does not serve, down, drained) is counted
apart, in ``only_elsewhere``: routing did not make it faster there, it made it possible.

What it cannot know (:data:`CAVEAT`): had everything gone to B, B would have run more at once than the
prices assumed (they saw the load routing left it), so the saving is usually understated; and one
median per backend corrects every price alike.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from typing import Any

from gateway.admin.accuracy import pairs, percentile

HOUR_S = 3600
CAVEAT = (
    "Each answered request's measured TTFT against what the router priced every other backend at when "
    "it chose (corrected by that backend's median actual/predicted). Not known: the queue a single "
    "backend would have built with all the traffic, so savings are usually understated."
)


def bought(entries: Sequence[Mapping[str, Any]], since: float, now: float) -> dict[str, Any]:
    """Per alternative backend, over the window and per hour (module docstring)."""
    corrections = {
        backend: percentile([actual / predicted for _, predicted, actual in points], 0.5) or 1.0
        for backend, points in pairs(entries, since).items()
    }
    hours: dict[int, dict[str, dict[str, float]]] = {}
    total: dict[str, dict[str, float]] = {}
    answered, alternatives = 0, _alternatives(entries, since)
    for entry, actual in _answered(entries, since):
        answered += 1
        hour = int(entry["at"] // HOUR_S * HOUR_S)
        prices = {c["backend"]: c.get("predicted_ttft_s") for c in entry["candidates"]}
        for backend in alternatives:
            saved = _saved(
                entry["chosen"], backend, prices.get(backend), corrections.get(backend, 1.0), actual
            )
            for bucket in (hours.setdefault(hour, {}), total):
                line = bucket.setdefault(backend, {"requests": 0, "saved_s": 0.0, "only_elsewhere": 0})
                if saved is None:
                    line["only_elsewhere"] += 1
                else:
                    line["requests"] += 1
                    line["saved_s"] += saved
    return {
        "since": since,
        "requests": answered,
        "corrections": {b: round(c, 3) for b, c in corrections.items()},
        "total": {b: _rounded(line) for b, line in sorted(total.items())},
        "hours": [
            {"start": hour, "alternatives": {b: _rounded(line) for b, line in sorted(lines.items())}}
            for hour, lines in sorted(hours.items(), reverse=True)
        ],
        "caveat": CAVEAT,
    }


def _answered(
    entries: Iterable[Mapping[str, Any]], since: float
) -> Iterable[tuple[Mapping[str, Any], float]]:
    for entry in entries:
        outcome = entry.get("outcome")
        if entry["at"] >= since and entry.get("chosen") and outcome and outcome.get("ttft_s") is not None:
            yield entry, float(outcome["ttft_s"])


def _alternatives(entries: Sequence[Mapping[str, Any]], since: float) -> list[str]:
    """Every backend that answered or was priced in the window."""
    seen: dict[str, None] = {}
    for entry, _ in _answered(entries, since):
        seen[entry["chosen"]] = None
        for candidate in entry["candidates"]:
            seen[candidate["backend"]] = None
    return list(seen)


def _saved(chosen: str, backend: str, price: float | None, correction: float, actual: float) -> float | None:
    """Seconds saved against ``backend`` (None: it could not have answered)."""
    if chosen == backend:
        return 0.0
    if price is None:
        return None
    return price * correction - actual


def _rounded(line: Mapping[str, float]) -> dict[str, Any]:
    requests = int(line["requests"])
    return {
        "requests": requests,
        "saved_s": round(line["saved_s"], 3),
        "saved_per_request_s": round(line["saved_s"] / requests, 3) if requests else None,
        "only_elsewhere": int(line["only_elsewhere"]),
    }
