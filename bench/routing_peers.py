"""The routing benchmark against the published routers (issue #45): per row, the best value any peer
profile reached per column (``best peer``), and ``cost`` against it on the targets (``bench/routing.py``)."""

from __future__ import annotations

import statistics
from collections.abc import Mapping, Sequence
from typing import Any

from routing_text import ratio, verdict
from routing_workloads import PEERS

from gateway.replay.results import BEST_SCHEDULE
from gateway.replay.results import ORACLE as ORACLE_ROW

BEST_PEER = "best peer"
VS_PEER = 0.8
"""``cost``'s mean TTFT against the best published router's, on a heterogeneous row (issue #45)."""
PEER_DRAW_SLACK = 1.10
"""No draw where the best peer's mean TTFT beats ``cost``'s by more than 10%."""
LOWER_IS_BETTER = (
    "errors", "ttft_mean_s", "ttft_p50_s", "ttft_p90_s", "ttft_mean_long_s", "completion_mean_s",
    "completion_p90_s", "awaited_mean_s", "awaited_p90_s", "session_completion_mean_s",
    "prefill_amplification",
)  # fmt: skip
AGENT_ROW = 0.5
"""Before the reports had ``awaited_*`` (an older ``--from-json``): a row whose requests are at least
this share agents' calls is judged on the time to the last token, the others on the first."""
HIGHER_IS_BETTER = ("throughput_tok_s", "cache_hit_ratio")


def best_peer(profiles: Mapping[str, Mapping[str, Any]]) -> dict[str, Any] | None:
    """Per metric, the best value any published router's profile reached on this row (each metric's
    best may be another peer's)."""
    peers = [profiles[p] for p in PEERS if p in profiles and profiles[p].get("requests")]
    if not peers:
        return None
    out: dict[str, Any] = {"requests": peers[0]["requests"]}
    for keys, best in ((LOWER_IS_BETTER, min), (HIGHER_IS_BETTER, max)):
        for key in keys:
            values = [p[key] for p in peers if p.get(key) is not None]
            out[key] = best(values) if values else None
    return out


def with_best_peer(profiles: Mapping[str, Mapping[str, Any]]) -> dict[str, Mapping[str, Any]]:
    """The row's profiles with a ``best peer`` line before the oracle's."""
    best = best_peer(profiles)
    out: dict[str, Mapping[str, Any]] = {}
    for name, summary in profiles.items():
        if name == ORACLE_ROW and best is not None:
            out[BEST_PEER] = best
        out[name] = summary
    return out


def judged_on(agent_share: float, awaited: bool = True) -> tuple[str, str, str]:
    """The mean and p90 keys a row is judged on, and their name: what its clients wait for (issue
    #61: an agent acts on a whole answer, a chat reader on the first token). A row of agents' calls
    alone: the time to the last token; a row without any: the TTFT; a mixed row: each request by its
    own clock (``awaited_*``, the report's docstring). ``awaited``: whether the report has those keys
    (an older one: the mixed row by its majority, ``AGENT_ROW``)."""
    if agent_share >= 1.0 or (not awaited and agent_share >= AGENT_ROW):
        return "completion_mean_s", "completion_p90_s", "time to the last token"
    if agent_share <= 0.0 or not awaited:
        return "ttft_mean_s", "ttft_p90_s", "TTFT"
    return "awaited_mean_s", "awaited_p90_s", "wait (agents' calls: last token, the rest: TTFT)"


def peer_targets(
    name: str, profiles: Mapping[str, Mapping[str, Any]], homogeneous: bool, agent_share: float = 0.0
) -> list[str]:
    """``cost`` against the best peer on the mean and p90 of what the row's clients wait for (an
    agents' row: the time to the last token, ``judged_on``; the targets: at most ``VS_PEER`` of its
    mean where vLLM and llama.cpp serve side by side, no more than it on one engine kind) and session
    completion."""
    best = best_peer(profiles)
    if best is None:
        return []
    cost = profiles["cost"]
    mean_key, p90_key, what = judged_on(agent_share, "awaited_mean_s" in cost)
    peers = [p for p in PEERS if p in profiles and profiles[p].get("requests")]
    leader = min(peers, key=lambda p: profiles[p].get(mean_key) or float("inf"))
    mean, p90 = cost[mean_key], cost[p90_key]
    if mean is None or p90 is None or best.get(mean_key) is None or best.get(p90_key) is None:
        return [f"  - against the best peer: no {what} measured"]
    bound = 1.0 if homogeneous else VS_PEER
    ok = mean <= bound * best[mean_key] and p90 <= best[p90_key]
    session = cost.get("session_completion_mean_s")
    peer_session = best.get("session_completion_mean_s")
    yardstick = profiles.get(BEST_SCHEDULE, {}).get(mean_key)
    between = ""
    if yardstick is not None and best[mean_key] > yardstick:
        share = (best[mean_key] - mean) / (best[mean_key] - yardstick)
        between = (
            f"; of the gap from the best peer ({best[mean_key]:.3f} s) to the best hindsight schedule "
            f"({yardstick:.3f} s) cost closes {share:.0%}"
        )
    return [
        f"  - against the best peer ({leader} on mean {what}): cost mean {mean:.3f} s = "
        f"{ratio(mean, best[mean_key])} its {best[mean_key]:.3f} s (<= {bound:.1f}x), p90 "
        f"{p90:.3f} s vs {best[p90_key]:.3f} s (no worse): {verdict(ok)}"
        + (
            f"; session completion {ratio(session, peer_session)} the best peer's"
            if session and peer_session
            else ""
        )
        + between
    ]


def peer_seed_target(ratios: Sequence[float], first: int = 0, on: str = "TTFT") -> str:
    """Per draw, ``cost`` / the draw's best peer on the mean ``on`` (what the row is judged on,
    ``judged_on``): no draw above ``PEER_DRAW_SLACK`` (``first``: the draw number of ``ratios[0]``)."""
    worst = max(range(len(ratios)), key=lambda i: ratios[i])
    over = [f"{first + i} ({r:.2f}x)" for i, r in enumerate(ratios) if r > PEER_DRAW_SLACK]
    return (
        f"  - per draw, cost / best peer mean {on}: geometric mean {statistics.geometric_mean(ratios):.2f}x, "
        f"worst {ratios[worst]:.2f}x (draw {first + worst}; target: no draw above {PEER_DRAW_SLACK:.2f}x): "
        f"{verdict(not over)}" + (f"; above it: {', '.join(over)}" if len(over) > 1 else "")
    )
