"""What routing bought (gateway.admin.bought): each answered request's measured TTFT against the other
backends' prices at decision time, corrected by how far each backend's predictions were off."""

from __future__ import annotations

from typing import Any

import pytest

from gateway.admin.bought import HOUR_S, bought

NOW = 100 * HOUR_S + 1800.0


def entry(at: float, chosen: str, ttft: float | None, **prices: float) -> dict[str, Any]:
    return {
        "at": at,
        "chosen": chosen,
        "candidates": [{"backend": b, "predicted_ttft_s": p} for b, p in prices.items()],
        "outcome": {"ttft_s": ttft},
    }


def test_savings_against_each_backend_alone_per_hour() -> None:
    entries = [  # newest first, as the log keeps them
        entry(NOW - 60, "llama", 0.5, llama=0.5, vllm=2.0),  # a warm slot: vllm would have taken 2 s
        entry(NOW - 120, "vllm", 1.0, llama=4.0, vllm=1.0),  # a cold prompt: llama.cpp would take 4 s
        entry(NOW - 2 * HOUR_S, "llama", 0.4, llama=0.4),  # too long for vllm: only llama.cpp could
    ]
    result = bought(entries, NOW - 24 * HOUR_S, NOW)
    assert result["requests"] == 3
    assert result["corrections"] == {"llama": 1.0, "vllm": 1.0}  # every prediction was exact
    assert result["total"]["vllm"] == {
        "requests": 2,
        "saved_s": pytest.approx(1.5),  # 2.0 - 0.5, and nothing on the request vllm answered
        "saved_per_request_s": pytest.approx(0.75),
        "only_elsewhere": 1,
    }
    assert result["total"]["llama"]["saved_s"] == pytest.approx(3.0)  # 4.0 - 1.0
    assert result["total"]["llama"]["only_elsewhere"] == 0
    assert [h["start"] for h in result["hours"]] == [100 * HOUR_S, 98 * HOUR_S]  # newest first
    assert result["hours"][1]["alternatives"]["vllm"] == {
        "requests": 0,
        "saved_s": 0.0,
        "saved_per_request_s": None,
        "only_elsewhere": 1,
    }


def test_prices_are_corrected_by_the_backend_measured_error() -> None:
    """vllm took twice what it was predicted whenever it answered: its price against the requests
    llama.cpp answered counts twice as much."""
    entries = [
        entry(NOW - 10, "vllm", 2.0, vllm=1.0, llama=3.0),
        entry(NOW - 20, "vllm", 2.0, vllm=1.0, llama=3.0),
        entry(NOW - 30, "llama", 1.0, vllm=1.5, llama=1.0),
    ]
    result = bought(entries, NOW - HOUR_S, NOW)
    assert result["corrections"] == {"vllm": 2.0, "llama": 1.0}
    assert result["total"]["vllm"]["saved_s"] == pytest.approx(1.5 * 2.0 - 1.0)
    assert result["total"]["llama"]["saved_s"] == pytest.approx(2 * (3.0 - 2.0))


def test_a_bad_choice_is_a_negative_saving_and_old_or_failed_requests_do_not_count() -> None:
    entries = [
        entry(NOW - 10, "llama", 5.0, vllm=1.0, llama=0.5),  # llama.cpp was predicted fast, was not
        entry(NOW - 20, "vllm", None, vllm=1.0, llama=0.5),  # failed before its first token
        {**entry(NOW - 30, "vllm", 1.0, vllm=1.0), "outcome": None},
        entry(NOW - 2 * HOUR_S, "vllm", 1.0, vllm=1.0, llama=9.0),  # outside the window
    ]
    result = bought(entries, NOW - HOUR_S, NOW)
    assert result["requests"] == 1
    assert result["total"]["vllm"]["saved_s"] == pytest.approx(1.0 - 5.0)  # no vllm sample: uncorrected
    assert "vllm" not in result["corrections"]


def test_no_traffic_buys_nothing() -> None:
    assert bought([], NOW - HOUR_S, NOW)["total"] == {}
