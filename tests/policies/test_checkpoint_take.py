"""A context checkpoint taken costs its time (``prefill.checkpoint_s``): llama-server serving a hybrid
model copies the recurrent state off the GPU at each checkpoint position as it processes a prompt,
and every slot waits (on the H100's 27B, ~150 MiB in ~0.12 s: three of them were 0.39 s of a 0.56 s
warm turn). The positions are the pinned server's, as its trace logged them (bench/gpu/results/
2026-12-07b-h100-q8-checkpoints/trace-turns.log): a cold chat prompt of 1,068 tokens took checkpoints
at 10 and 1,063 (n_tokens 11 and 1,064); the next turn of 1,878 tokens from 1,479 cached took them at
1,479, 1,561 (its user message) and 1,874."""

from __future__ import annotations

import pytest
from msgspec.structs import replace

from policies.checkpoints import checkpoint_positions
from policies.engine_profile import DecodeModel, EngineProfile, Point, PrefillModel
from policies.profile_fit import fit_prefill

GAP = 2048  # compose's --ubatch-size 2048 --batch-size 2048: min(batch, 4 + ubatch)
TAKE_S = 0.125


def profile(checkpoint_s: float = TAKE_S, *, splits: bool = True) -> EngineProfile:
    prefill = PrefillModel(
        token_s=1 / 5000,
        request_s=0.02,
        ubatch=2048,
        batch=2048,
        checkpoint_splits=splits,
        checkpoint_s=checkpoint_s,
    )
    return EngineProfile(name="t", engine="llamacpp", prefill=prefill, decode=DecodeModel(step_s=0.016))


def test_the_positions_are_the_servers() -> None:
    assert checkpoint_positions(1068, 0, GAP, user_start=11) == [11, 1064]
    assert checkpoint_positions(1878, 1479, GAP, user_start=1561) == [1479, 1561, 1874]
    assert checkpoint_positions(4, 0, GAP) == []  # nothing in memory before any of them
    assert checkpoint_positions(1000 + 4, 1000, GAP) == [1000]  # 4 tokens on: one, where it starts


def test_a_cold_prompt_also_checkpoints_its_first_user_message() -> None:
    """The CPU build's trace of a cold 2,003-token chat (system, user, assistant, user; --ubatch-size
    512): checkpoints at 973 (the first user message), 1,487, 1,604 (the last user message) and
    1,999. A warm prompt keeps the slot's checkpoints, and the server ends no step at its first user
    message then (tests/real/test_llama_first_user_checkpoint_contract.py)."""
    assert checkpoint_positions(2003, 0, 516, user_start=1604, first_user=973) == [973, 1487, 1604, 1999]
    assert checkpoint_positions(2003, 0, 516, user_start=973, first_user=973) == [973, 1487, 1999]
    assert checkpoint_positions(2003, 900, 516, user_start=1604, first_user=973) == [1487, 1604, 1999]
    fresh, taking = profile(), profile().prefill_seconds(2003, 0, 1604, first_user=973)
    assert taking - fresh.prefill_seconds(2003, 0, 1604) == pytest.approx(TAKE_S)


def test_a_prompt_pays_each_checkpoint_it_takes() -> None:
    paying, free = profile(), profile(0.0)
    warm = paying.prefill_seconds(399, 1479, user_start=1561) - free.prefill_seconds(
        399, 1479, user_start=1561
    )
    assert warm == pytest.approx(3 * TAKE_S)
    assert paying.prefill_seconds(1068, 0, 11) - free.prefill_seconds(1068, 0, 11) == pytest.approx(
        2 * TAKE_S
    )
    assert paying.prefill_seconds(4, 1000) - free.prefill_seconds(4, 1000) == pytest.approx(TAKE_S)


def test_an_engine_without_checkpoints_pays_none() -> None:
    assert profile(splits=False).prefill_seconds(399, 1479) == profile(0.0, splits=False).prefill_seconds(
        399, 1479
    )


def test_the_fit_takes_the_checkpoints_out_of_the_points_first() -> None:
    """Points timed with their checkpoints in, fitted with ``checkpoint_s`` measured apart: the other
    coefficients come back as they were. Fitted without it, the fixed costs take the two checkpoints
    a cold prompt has, and a warm chat turn, which takes three, comes out far too short (the H100
    27B's turns: 0.38 s predicted, 0.62 s measured)."""
    truth = profile()
    cases = [(16, 0), (1024, 0), (2085, 0), (16384, 0), (32768, 0), (1027, 16384), (3083, 17411), (4, 5000)]
    points = [Point(new, cached, truth.prefill_seconds(new, cached)) for new, cached in cases]
    fitted = fit_prefill(replace(truth.prefill, request_s=0.0, token_s=1.0), points, attention=False)
    assert fitted.checkpoint_s == TAKE_S
    assert fitted.request_s == pytest.approx(truth.prefill.request_s, abs=1e-6)
    assert fitted.token_s == pytest.approx(truth.prefill.token_s, rel=1e-6)
    blind = replace(
        truth, prefill=fit_prefill(replace(truth.prefill, checkpoint_s=0.0), points, attention=False)
    )
    turn = (399, 1479, 1561)
    assert blind.prefill_seconds(*turn) < 0.6 * truth.prefill_seconds(*turn)
