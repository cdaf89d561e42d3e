"""The suite's Hypothesis profiles (tests/conftest.py): properties, not the machine's speed, decide."""

from __future__ import annotations

import time
from typing import Any

import pytest
from hypothesis import HealthCheck, Phase, core, given, settings
from hypothesis import strategies as st
from hypothesis.errors import DeadlineExceeded, FailedHealthCheck, Flaky

from tests.conftest import hypothesis_profile, hypothesis_seed

SLOW = 0.3  # seconds per example drawn and per example run: a loaded machine, exaggerated


def slow_draws(base: settings) -> Any:
    @settings(base, max_examples=4, database=None, phases=[Phase.generate])
    @given(st.integers().map(lambda x: (time.sleep(2 * SLOW), x)[1]))
    def prop(x: int) -> None:
        assert isinstance(x, int)

    return prop


def slow_examples(base: settings) -> Any:
    @settings(base, max_examples=2, database=None, phases=[Phase.generate])
    @given(st.integers())
    def prop(x: int) -> None:
        time.sleep(SLOW)
        assert isinstance(x, int)

    return prop


def test_a_slow_machine_is_not_a_failure_under_the_suites_profile() -> None:
    active = settings.get_profile(settings.get_current_profile_name())
    assert active.deadline is None
    assert HealthCheck.too_slow in active.suppress_health_check
    slow_draws(active)()  # passes: slow generation and slow examples are not assertions
    slow_examples(active)()


def test_the_same_properties_fail_under_hypothesis_defaults() -> None:
    """What the profile removes: without it, the same properties fail for speed alone."""
    with pytest.raises(FailedHealthCheck):
        slow_draws(settings.get_profile("default"))()
    with pytest.raises((DeadlineExceeded, Flaky)):
        slow_examples(settings.get_profile("default"))()


def test_every_profile_keeps_the_health_checks_that_are_not_about_speed() -> None:
    for name in ("dev", "ci", "long"):
        profile = settings.get_profile(name)
        assert set(profile.suppress_health_check) == {HealthCheck.too_slow}, name
        assert profile.deadline is None


@pytest.mark.parametrize(
    ("env", "profile", "seed"),
    [
        ({"CI": "true"}, "ci", 0),
        ({"CI": "true", "TURNOUT_HYPOTHESIS_SEED": "7"}, "ci", 7),
        ({"TURNOUT_HYPOTHESIS_PROFILE": "long", "TURNOUT_HYPOTHESIS_SEED": "9"}, "long", 9),
        ({}, "dev", None),
    ],
)
def test_profile_and_seed_from_the_environment(
    monkeypatch: pytest.MonkeyPatch, env: dict[str, str], profile: str, seed: int | None
) -> None:
    for name in ("CI", "TURNOUT_HYPOTHESIS_PROFILE", "TURNOUT_HYPOTHESIS_SEED"):
        monkeypatch.delenv(name, raising=False)
    for name, value in env.items():
        monkeypatch.setenv(name, value)
    assert hypothesis_profile() == profile
    chosen = hypothesis_seed(profile)
    assert chosen == seed if seed is not None else 0 <= chosen < 2**32


def test_this_run_has_a_forced_seed_that_the_header_prints() -> None:
    assert core.global_force_seed is not None
