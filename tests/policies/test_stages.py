"""The route's named steps: the built-in stages around a profile's filters, in order, and its picker;
and the request features the gateway reads through ``policies.features.request_features``."""

from __future__ import annotations

import pytest

from policies import Endpoint
from policies.features import (
    SIZE_FLOOR_HEADER,
    FeatureError,
    ModelFacts,
    output_cap,
    request_features,
)
from policies.profiles import ProfileError, build_profile
from policies.stages import PICKERS, stages

BODY = {"model": "m", "messages": [{"role": "user", "content": "hi"}]}


def test_the_built_in_stages_run_around_the_profile_s_filters_in_order() -> None:
    names = [name for name, _ in stages(("healthy", "context-fits"))]
    assert names == [
        "not-drained", "awake", "healthy", "context-fits", "size-floor", "pinned-member", "keeps-model"
    ]  # fmt: skip


def test_a_profile_names_its_picker_and_an_unknown_one_is_refused() -> None:
    profile = build_profile("p", scorers={"least-loaded": 1.0})
    assert profile.picker == "best-score"
    assert profile.picker in PICKERS
    with pytest.raises(ProfileError, match="unknown picker 'coin'"):
        build_profile("p", scorers={"least-loaded": 1.0}, picker="coin")


def test_request_features_carry_the_group_and_the_size_asked_for() -> None:
    group = ModelFacts("g", members=("small", "large"), prefer_default=0.25, reasoning_floor_b=100.0)
    plain = request_features(BODY, Endpoint.CHAT, {}, group)
    assert plain.members == ("small", "large")
    assert plain.prefer_default == 0.25
    assert plain.min_params_b is None
    assert request_features(BODY, Endpoint.CHAT, {SIZE_FLOOR_HEADER: "30"}, group).min_params_b == 30.0
    deep = {**BODY, "reasoning_effort": "high"}
    assert request_features(deep, Endpoint.CHAT, {SIZE_FLOOR_HEADER: "30"}, group).min_params_b == 100.0
    assert request_features(deep, Endpoint.CHAT, {SIZE_FLOOR_HEADER: "300"}, group).min_params_b == 300.0
    assert request_features(BODY, Endpoint.CHAT, {}, group).shape is None  # added once sent


@pytest.mark.parametrize("text", ["0", "-3", "nan", "inf", "big"])
def test_an_unreadable_size_floor_is_the_client_s_error(text: str) -> None:
    with pytest.raises(FeatureError, match="positive number") as raised:
        request_features(BODY, Endpoint.CHAT, {SIZE_FLOOR_HEADER: text}, ModelFacts("m"))
    assert raised.value.param == SIZE_FLOOR_HEADER


def test_the_output_cap_fills_only_an_unset_limit() -> None:
    assert output_cap(BODY, Endpoint.CHAT, 512) == {"max_tokens": 512}
    assert output_cap({**BODY, "max_completion_tokens": 9}, Endpoint.CHAT, 512) == {}
    assert output_cap(BODY, Endpoint.RESPONSES, 512) == {"max_output_tokens": 512}
    assert output_cap(BODY, Endpoint.COUNT_TOKENS, 512) == {}
    assert output_cap(BODY, Endpoint.CHAT, None) == {}


def test_the_output_cap_lowers_a_limit_above_the_models_to_it() -> None:
    asked = {**BODY, "max_tokens": 10_000_000, "max_completion_tokens": 100}
    assert output_cap(asked, Endpoint.CHAT, 512, ceiling=23_500) == {"max_tokens": 23_500}
    assert output_cap({**BODY, "max_tokens": 23_500}, Endpoint.CHAT, 512, ceiling=23_500) == {}
    assert output_cap(BODY, Endpoint.CHAT, None, ceiling=23_500) == {}  # unset stays unset without a limit
    assert output_cap({**BODY, "max_tokens": 10_000_000}, Endpoint.CHAT, 512) == {}  # no ceiling known
