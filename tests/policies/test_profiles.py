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


def test_documented_builtin_profiles_match_the_registry() -> None:
    """docs/adding-a-policy.md lists every built-in profile with its scorers and weights."""
    from pathlib import Path

    from policies import BUILTIN_PROFILES

    doc = (Path(__file__).parents[2] / "docs" / "adding-a-policy.md").read_text()
    rows = {
        line.split("|")[1].strip().strip("`").removesuffix("` (default)"): line.split("|")[2].strip()
        for line in doc.splitlines()
        if line.startswith("| `")
    }
    assert set(rows) == set(BUILTIN_PROFILES)
    for name, profile in BUILTIN_PROFILES.items():
        expected = ", ".join(f"`{scorer}` {weight}" for scorer, weight in profile.scorers)
        assert rows[name] == expected
