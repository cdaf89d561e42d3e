"""Live sessions: counted from their last turn for a window, bounded, oldest dropped first."""

from __future__ import annotations

import pytest

from gateway.live import TURN_WEIGHT, FollowUps, Homes, LiveSessions
from policies.coming import NextTurn


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


AGENT, CHAT = 1, 2  # two prompt families: an agent harness's system prompt, a chat UI's


def test_each_prompt_family_learns_its_own_follow_up_rate() -> None:
    follow = FollowUps(window=100)
    for _ in range(20):  # one gateway, both kinds of traffic: the global rate is their mix
        follow.first_turn(AGENT)
        follow.second_turn(AGENT)
        follow.first_turn(CHAT)
    assert 0.4 < follow.rate < 0.6
    follow.first_turn(AGENT)
    assert follow.rate_for(AGENT) > 0.95  # the agents' first turns look ahead...
    follow.first_turn(CHAT)
    assert follow.rate_for(CHAT) < 0.05  # ...the one-offs' do not


def test_a_new_family_starts_at_the_global_rate_and_moves_off_it_with_its_own_turns() -> None:
    follow = FollowUps(window=100, prior=1.0)
    for _ in range(10):
        follow.first_turn(CHAT)
    follow.first_turn(AGENT)  # a harness never seen: counted, then asked
    assert follow.rate_for(AGENT) == pytest.approx(follow.rate)
    follow.second_turn(AGENT)
    follow.first_turn(AGENT)  # the next agent: one follow-up in one earlier first turn, plus the prior
    decay = 1.0 - 1.0 / 100  # the earlier turn weighs a little less
    assert follow.rate_for(AGENT) == pytest.approx((decay + follow.rate) / (decay + 1.0))
    assert follow.rate_for(None) == follow.rate  # a prompt under one chunk has no family


def test_a_second_turn_of_a_family_never_seen_counts_only_globally() -> None:
    follow = FollowUps()
    follow.first_turn(CHAT)
    follow.second_turn(AGENT)  # its first turn was routed by another replica, or dropped
    assert follow.rate == pytest.approx(2 / 3)
    follow.first_turn(AGENT)
    assert follow.rate_for(AGENT) == pytest.approx(follow.rate)


def test_the_families_tracked_are_bounded_least_recently_seen_first_out() -> None:
    follow = FollowUps(max_families=2)
    follow.first_turn(AGENT)
    follow.second_turn(AGENT)
    follow.first_turn(CHAT)
    follow.first_turn(AGENT)  # seen again: now the most recent
    follow.first_turn(3)  # over the bound: CHAT goes
    assert follow.rate_for(CHAT) == follow.rate  # forgotten: the global rate
    assert follow.rate_for(AGENT) > follow.rate  # kept


def test_a_session_is_at_home_while_its_turn_runs_and_seconds_after() -> None:
    homes = Homes(active_s=10.0)
    homes.placed("a", "llama-0", 0.0)
    homes.placed("b", "llama-0", 0.0)
    homes.placed("c", "llama-1", 0.0)
    assert homes.counts(0.0) == {"llama-0": 2, "llama-1": 1}
    assert homes.counts(500.0) == {"llama-0": 2, "llama-1": 1}  # in flight: no end yet
    homes.ended("a", 500.0)
    assert homes.counts(509.0) == {"llama-0": 2, "llama-1": 1}
    assert homes.counts(511.0) == {"llama-0": 1, "llama-1": 1}  # a went quiet
    assert homes.counts(511.0, excluding="b") == {"llama-1": 1}  # the session being routed
    assert homes.counts(511.0, excluding="a") == {"llama-0": 1, "llama-1": 1}  # not at home: nothing


def test_a_turn_that_follows_keeps_the_session_at_home_and_a_move_takes_it_along() -> None:
    homes = Homes(active_s=10.0)
    homes.placed("a", "llama-0", 0.0)
    homes.ended("a", 0.0)
    homes.placed("a", "llama-1", 0.0)  # its next turn, on another server
    assert homes.counts(1.0) == {"llama-1": 1}
    assert homes.counts(20.0) == {"llama-1": 1}  # the first turn's end does not send it away
    homes.ended("a", 30.0)
    assert homes.counts(41.0) == {}


def test_a_session_with_turns_in_parallel_stays_until_the_last_one_ends() -> None:
    """Two turns of one session in flight at once (an agent's parallel calls): the session counts
    once, and stays until ``active_s`` after both ended."""
    homes = Homes(active_s=10.0)
    homes.placed("a", "llama-0", 0.0)
    homes.placed("a", "llama-0", 0.0)
    assert homes.counts(0.0) == {"llama-0": 1}
    homes.ended("a", 1.0)  # one of them: the other still runs
    assert homes.counts(30.0) == {"llama-0": 1}
    homes.ended("a", 31.0)
    assert homes.counts(40.0) == {"llama-0": 1}
    assert homes.counts(41.5) == {}


def test_the_homes_bookkeeping_is_bounded() -> None:
    homes = Homes(max_tracked=3)
    for n in range(5):
        homes.placed(f"s{n}", "llama-0", float(n))  # turns whose end never comes
    assert homes.counts(5.0) == {"llama-0": 3}


def test_a_turn_whose_end_never_came_goes_stale() -> None:
    homes = Homes(stale_s=600.0)
    homes.placed("a", "llama-0", 0.0)
    homes.placed("b", "llama-0", 100.0)
    assert homes.counts(599.0) == {"llama-0": 2}
    assert homes.counts(601.0) == {"llama-0": 1}


def test_a_re_route_moves_the_turn_without_counting_another() -> None:
    homes = Homes(active_s=10.0)
    homes.placed("a", "llama-0", 0.0)
    homes.placed("a", "llama-1", 0.5, again=True)  # llama-0 refused it: the same turn, elsewhere
    assert homes.counts(1.0) == {"llama-1": 1}
    homes.ended("a", 2.0)  # its one end
    assert homes.counts(12.5) == {}


def test_a_session_s_next_turn_comes_when_its_turn_ends_after_its_think_time() -> None:
    """``Homes.coming``: nothing before a think time and a growth were seen; then each other session
    at home tells when it is ready (its running turn's predicted end, or its last end), its think
    time and its growth a turn, its own where it has them, else the fleet's."""
    homes = Homes(active_s=10.0)
    homes.placed("a", "llama-0", 0.0, prompt_tokens=10_000, ends_at=3.0)
    assert homes.coming(0.0) == {}  # no sample of either yet
    homes.ended("a", 2.5)
    homes.placed("a", "llama-0", 4.0, prompt_tokens=12_000, ends_at=7.0)  # 1.5 s thought, 2,000 more
    homes.placed("b", "vllm", 4.0, prompt_tokens=5_000, ends_at=6.0)  # a first turn: the fleet's
    coming = homes.coming(4.0)
    assert coming == {
        "llama-0": (NextTurn(ready_at=7.0, think_s=1.5, tokens=2000, cached=12_000),),
        "vllm": (NextTurn(ready_at=6.0, think_s=1.5, tokens=2000, cached=5_000),),
    }
    assert homes.coming(4.0, excluding="a") == {"vllm": coming["vllm"]}  # the session routed
    homes.ended("a", 6.5)  # earlier than predicted: ready from its real end
    assert homes.coming(6.5)["llama-0"][0].ready_at == 6.5
    homes.placed("a", "llama-0", 7.5, prompt_tokens=18_000, ends_at=9.0)  # 1 s, 6,000 more
    (turn,) = homes.coming(7.5)["llama-0"]
    assert turn.think_s == pytest.approx(1.5 + TURN_WEIGHT * (1.0 - 1.5))
    assert turn.tokens == round(2000 + TURN_WEIGHT * (6000 - 2000))


def test_a_re_route_or_a_turn_beside_a_running_one_teaches_no_think_time() -> None:
    homes = Homes(active_s=10.0)
    homes.placed("a", "llama-0", 0.0, prompt_tokens=10_000, ends_at=3.0)
    homes.placed("a", "llama-1", 0.5, again=True, prompt_tokens=10_000, ends_at=3.5)  # refused: the same turn
    homes.placed("a", "llama-1", 1.0, prompt_tokens=11_000, ends_at=4.0)  # in parallel with it
    assert homes.coming(1.0) == {}  # growth seen, think time not: no next turn told


def test_a_session_with_turns_in_parallel_is_ready_when_the_later_one_ends() -> None:
    """A turn sent beside one still running (a sub-agent's call) does not make the session ready at
    its own end if the other ends later; a re-route is the same turn, and its new end replaces its own
    (not the other's)."""
    homes = Homes(active_s=10.0)
    homes.placed("a", "llama-0", 0.0, prompt_tokens=10_000, ends_at=3.0)
    homes.ended("a", 2.5)
    homes.placed("a", "llama-0", 4.0, prompt_tokens=12_000, ends_at=20.0)  # a long answer
    homes.placed("a", "llama-0", 5.0, prompt_tokens=13_000, ends_at=8.0)  # a short one beside it
    (turn,) = homes.coming(5.0)["llama-0"]
    assert turn.ready_at == 20.0
    homes.placed("a", "llama-1", 5.5, again=True, prompt_tokens=13_000, ends_at=9.0)  # refused, sent on
    (turn,) = homes.coming(5.5)["llama-1"]
    assert turn.ready_at == 20.0  # the long answer still runs
    homes.placed("b", "llama-0", 0.0, prompt_tokens=1_000, ends_at=30.0)
    homes.placed("b", "llama-1", 0.5, again=True, prompt_tokens=1_000, ends_at=6.0)  # its only turn
    assert homes.coming(0.5)["llama-1"][-1].ready_at == 6.0
