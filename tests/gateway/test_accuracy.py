"""Prediction accuracy from the decision log (gateway.admin.accuracy): ratios, slices, the scatter."""

from __future__ import annotations

from typing import Any

import pytest

from gateway.admin.accuracy import MAX_DRAWN, PLOT_PX, pairs, scatter, summary


def entry(at: float, backend: str | None, predicted: float | None, actual: float | None) -> dict[str, Any]:
    return {
        "at": at,
        "chosen": backend,
        "candidates": [
            {"backend": "a", "predicted_ttft_s": predicted},
            {"backend": "b", "predicted_ttft_s": 9.0},
        ],
        "outcome": None if actual is None else {"ttft_s": actual},
    }


def test_pairs_keep_answered_requests_with_both_times_since_the_window() -> None:
    entries = [
        entry(5.0, "a", 1.0, 2.0),
        entry(1.0, "a", 1.0, 1.0),
        entry(0.5, "a", 1.0, 3.0),  # before the window
        entry(6.0, "a", None, 1.0),  # nothing predicted
        entry(7.0, "a", 1.0, None),  # not answered
        entry(8.0, None, 1.0, 1.0),  # refused
        entry(9.0, "b", 1.0, 4.5),  # b's own prediction (9 s), not a's
    ]
    assert pairs(entries, since=1.0) == {"a": [(1.0, 1.0, 1.0), (5.0, 1.0, 2.0)], "b": [(9.0, 9.0, 4.5)]}


def test_summary_gives_the_ratio_over_the_window_and_per_slice() -> None:
    points = [(0.0, 1.0, 1.0), (1.0, 1.0, 2.0), (2.0, 2.0, 2.0), (3.0, 1.0, 4.0)]  # ratios 1, 2, 1, 4
    stats = summary(points, since=0.0, now=4.0, slices=2)
    assert (stats["requests"], stats["median"], stats["p90"]) == (4, 1.0, 4.0)
    assert stats["slices"] == [
        {"start": 0.0, "requests": 2, "median": 1.0, "p90": 2.0},
        {"start": 2.0, "requests": 2, "median": 1.0, "p90": 4.0},
    ]
    assert summary([], since=0.0, now=4.0, slices=2)["median"] is None


def test_the_scatter_is_on_shared_log_axes_with_a_tick_per_decade() -> None:
    plot = scatter([(0.01, 1.0), (1.0, 0.01), (0.1, 0.1)])
    assert plot["ticks"] == [["10 ms", 0.0], ["100 ms", PLOT_PX / 2], ["1 s", float(PLOT_PX)]]
    # x grows with the prediction, y (SVG: down) falls as the actual time grows; exact is the diagonal
    assert plot["points"] == [[0.0, 0.0], [float(PLOT_PX), float(PLOT_PX)], [PLOT_PX / 2, PLOT_PX / 2]]
    assert scatter([])["points"] == []


@pytest.mark.parametrize("value", [0.0, 1e-9])
def test_a_time_of_zero_is_drawn_at_the_floor(value: float) -> None:
    plot = scatter([(value, 1.0)])
    assert plot["points"][0][0] == 0.0


def test_the_scatter_draws_the_newest_points_and_the_statistics_use_all() -> None:
    points = [(float(i), 1.0, 1.0 if i < 300 else 2.0) for i in range(MAX_DRAWN + 100)]
    stats = summary(points, since=0.0, now=float(MAX_DRAWN + 100), slices=4)
    assert (stats["requests"], stats["drawn"]) == (MAX_DRAWN + 100, MAX_DRAWN)
    assert len(stats["plot"]["points"]) == MAX_DRAWN
    assert sum(s["requests"] for s in stats["slices"]) == MAX_DRAWN + 100
    assert stats["slices"][0]["median"] == 1.0  # the oldest, left out of the drawing, are counted
