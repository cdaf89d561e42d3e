"""Live sessions: counted from their last turn for a window, bounded, oldest dropped first."""

from __future__ import annotations

from gateway.live import FollowUps, LiveSessions


def test_a_session_counts_until_its_window_of_silence_ends() -> None:
    live = LiveSessions(window=60.0)
    live.touch("a", 0.0)
    live.touch("b", 30.0)
    assert live.count(59.0) == 2
    assert live.count(61.0) == 1  # a went quiet
    live.touch("b", 80.0)  # a turn moves b on
    assert live.count(100.0) == 1
    assert live.count(141.0) == 0


def test_touching_a_session_again_does_not_count_it_twice() -> None:
    live = LiveSessions(window=60.0)
    for t in range(10):
        live.touch("a", float(t))
    assert live.count(10.0) == 1


def test_the_bookkeeping_is_bounded() -> None:
    live = LiveSessions(window=1e9, max_tracked=3)
    for n in range(5):
        live.touch(f"s{n}", float(n))
    assert live.count(5.0) == 3


def test_the_follow_up_rate_starts_at_a_half_and_learns_the_traffic() -> None:
    follow = FollowUps(window=100)
    assert follow.rate == 0.5
    for _ in range(50):  # one-off requests: first turns that never come back
        follow.first_turn()
    assert follow.rate < 0.05
    for _ in range(200):  # agents: every conversation has a second turn
        follow.first_turn()
        follow.second_turn()
    assert follow.rate > 0.9


def test_a_second_turn_cannot_outnumber_the_first_turns() -> None:
    follow = FollowUps()
    for _ in range(5):
        follow.second_turn()  # second turns of conversations this process never saw start
    assert follow.rate == 0.5  # (0 + 1) / (0 + 2): nothing counted
