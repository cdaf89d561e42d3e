"""A calibration's decode step is timed while every sequence decodes (``backends.calibrate.together``).

The timestamps are made up (no clock is read): what is tested is which stretch is timed, and that the
streams are stopped once every sequence has made enough tokens after the barrier.
"""

from __future__ import annotations

import asyncio

import pytest

from backends.calibrate.together import Stream, Tick, decode_together, step_seconds


def ticks(start: float, step: float, n: int) -> list[float]:
    return [start + i * step for i in range(n)]


def test_the_step_is_timed_after_the_last_sequence_started() -> None:
    # the first sequence decodes at 50 ms a token while the second is prefilled, then at 20 ms
    early = ticks(0.0, 0.05, 20) + ticks(1.0, 0.02, 30)
    late = ticks(1.0, 0.02, 30)
    assert step_seconds([early, late]) == pytest.approx(0.02)
    # timed from each sequence's own first token (the old way) it would have been 0.0322
    assert (early[-1] - early[0]) / (len(early) - 1) == pytest.approx(0.0322, abs=1e-4)


def test_the_slowest_sequence_sets_the_step() -> None:
    assert step_seconds([ticks(0.0, 0.02, 10), ticks(0.0, 0.03, 10)]) == pytest.approx(0.03)


def test_a_sequence_that_ended_before_the_others_started_counts_from_its_own_first_token() -> None:
    assert step_seconds([ticks(0.0, 0.02, 5), ticks(1.0, 0.025, 10)]) == pytest.approx(0.025)


def test_no_tokens_is_an_error() -> None:
    with pytest.raises(ValueError, match="no sequence"):
        step_seconds([[], []])
    with pytest.raises(ValueError, match="two tokens"):
        step_seconds([[1.0]])


def test_the_streams_stop_once_each_made_enough_tokens_after_the_barrier() -> None:
    made: list[int] = []

    def stream(delay: int, limit: int = 10_000) -> Stream:
        async def run(tick: Tick) -> None:
            for _ in range(delay):  # the others' prefill: this sequence has no token yet
                await asyncio.sleep(0)
            count = 0
            while count < limit:
                await asyncio.sleep(0)
                count += 1
                if tick():
                    break
            made.append(count)

        return run

    step = asyncio.run(decode_together([stream(0), stream(40), stream(80)], n_tokens=8))
    assert step >= 0
    assert len(made) == 3
    # the first stream ran ~80 loop turns before the last one's first token, then 8 more; none ran on
    assert max(made) < 200
    assert min(made) > 8


def test_an_answer_that_ends_early_does_not_hang_the_others() -> None:
    async def short(tick: Tick) -> None:
        for _ in range(3):
            await asyncio.sleep(0)
            tick()

    async def long(tick: Tick) -> None:
        for _ in range(50):
            await asyncio.sleep(0)
            if tick():
                return

    assert asyncio.run(decode_together([short, long], n_tokens=8)) >= 0
