"""The clock seam (``backends.clock``): the wall clock, a virtual one, and the discrete-event loop."""

from __future__ import annotations

import time

import pytest

from backends.clock import VIRTUAL_EPOCH, WALL, Events, VirtualClock


def test_the_wall_clock_reads_time() -> None:
    before_wall, before_mono = time.time(), time.monotonic()
    wall, mono = WALL.time(), WALL.monotonic()
    assert before_wall <= wall <= time.time()
    assert before_mono <= mono <= time.monotonic()


def test_a_virtual_clock_moves_only_when_told_and_never_back() -> None:
    clock = VirtualClock()
    assert (clock.monotonic(), clock.time()) == (0.0, VIRTUAL_EPOCH)
    clock.advance_to(12.5)
    assert (clock.monotonic(), clock.time()) == (12.5, VIRTUAL_EPOCH + 12.5)
    with pytest.raises(ValueError, match="cannot go back"):
        clock.advance_to(3.0)
    assert VirtualClock(5.0, epoch=0.0).time() == 5.0


def test_events_run_in_time_order_ties_in_the_order_scheduled() -> None:
    events, seen = Events(), []
    events.at(2.0, lambda: seen.append(("b", events.now)))
    events.at(1.0, lambda: seen.append(("a", events.now)))
    events.at(2.0, lambda: seen.append(("c", events.now)))
    events.run()
    assert seen == [("a", 1.0), ("b", 2.0), ("c", 2.0)]
    assert (events.processed, len(events)) == (3, 0)


def test_what_a_callback_schedules_runs_when_its_time_comes_and_the_past_means_now() -> None:
    events, seen = Events(), []

    def first() -> None:
        seen.append(("first", events.now))
        events.after(0.5, lambda: seen.append(("later", events.now)))
        events.at(0.0, lambda: seen.append(("late", events.now)))  # already past: runs now, after first

    events.at(1.0, first)
    events.run()
    assert seen == [("first", 1.0), ("late", 1.0), ("later", 1.5)]


def test_run_until_stops_before_later_events_with_the_clock_at_until() -> None:
    events, seen = Events(), []
    events.at(1.0, lambda: seen.append(1))
    events.at(5.0, lambda: seen.append(5))
    events.run(until=3.0)
    assert (seen, events.now, len(events)) == ([1], 3.0, 1)
    events.run()
    assert (seen, events.now) == ([1, 5], 5.0)
