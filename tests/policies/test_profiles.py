"""Profiles are validated against the registries when built."""

from __future__ import annotations

import pytest

from policies import ProfileError, build_profile


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"scorers": {"nope": 1.0}}, "unknown scorer 'nope'"),
        ({"scorers": {"least-loaded": 0.0}}, "positive weight"),
        ({"scorers": {}}, "at least one scorer"),
        ({"scorers": {"least-loaded": 1.0}, "filters": ["healthy", "nope"]}, "unknown filter 'nope'"),
    ],
)
def test_bad_profiles(kwargs: dict[str, object], message: str) -> None:
    with pytest.raises(ProfileError, match=message):
        build_profile("p", **kwargs)  # type: ignore[arg-type]
