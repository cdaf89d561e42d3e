"""The circuit breaker's states: closed, open for a cool-down, half-open with one trial."""

from __future__ import annotations

from backends.breaker import Breaker, Circuit


class Clock:
    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


def test_three_failures_in_a_row_open_the_circuit_and_a_success_between_resets_them() -> None:
    breaker = Breaker(3, 5.0, 60.0, Clock())
    assert [breaker.failed("500"), breaker.failed("500")] == [False, False]
    breaker.succeeded()
    assert [breaker.failed("500"), breaker.failed("500")] == [False, False]
    assert breaker.failed("500") is True
    assert (breaker.state, breaker.allows(), breaker.trips) == (Circuit.OPEN, False, 1)


def test_after_the_cool_down_one_trial_goes_and_its_success_closes_the_circuit() -> None:
    clock = Clock()
    breaker = Breaker(1, 5.0, 60.0, clock)
    breaker.failed("hung")
    clock.now = 5.0
    assert (breaker.state, breaker.allows()) == (Circuit.HALF_OPEN, True)
    breaker.sent()
    assert not breaker.allows()  # one trial at a time
    breaker.succeeded()
    assert (breaker.state, breaker.allows(), breaker.failures) == (Circuit.CLOSED, True, 0)


def test_a_failed_trial_doubles_the_cool_down_up_to_its_limit() -> None:
    clock = Clock()
    breaker = Breaker(1, 5.0, 12.0, clock)
    breaker.failed("502")
    for expected in (10.0, 12.0, 12.0):
        clock.now = breaker.open_until or 0.0
        breaker.sent()
        assert breaker.failed("502") is True
        assert breaker.cool_down_s == expected
        assert breaker.open_until == clock.now + expected


def test_a_trial_that_ends_without_a_verdict_lets_the_next_one_go() -> None:
    """The client left, or the request was refused for its own fault: no word on the engine."""
    clock = Clock()
    breaker = Breaker(1, 5.0, 60.0, clock)
    breaker.failed("reset")
    clock.now = 6.0
    breaker.sent()
    breaker.ended()
    assert breaker.allows()
