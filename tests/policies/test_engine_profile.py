"""Engine profiles: the batching rules, the prices, the fit and the schema (policies.engine_profile)."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from policies.engine_profile import (
    CacheModel,
    DecodeModel,
    EngineProfile,
    Point,
    PrefillModel,
    ProfileSchemaError,
    linear_profile,
    profile_from_mapping,
    profile_to_mapping,
)
from policies.profile_fit import fit_decode, fit_prefill

CPU_MOE = PrefillModel(
    token_s=0.001, batch_s=6.0, batch_min=32, ubatch=512, batch=2048, checkpoint_splits=True
)


def profile(prefill: PrefillModel = CPU_MOE, decode: DecodeModel | None = None) -> EngineProfile:
    return EngineProfile(
        name="t", engine="llamacpp", prefill=prefill, decode=decode or DecodeModel(step_s=0.03)
    )


class TestBatching:
    def test_llama_server_cuts_a_prompt_before_its_last_ubatch_and_its_last_four_tokens(self) -> None:
        """As llama-server does for a hybrid model (tools/server: checkpoint offsets 4 + n_ubatch and 4)."""
        steps = list(profile().prefill_steps(3000))
        assert steps == [(2048, 0), (3000 - 516 - 2048, 2048), (512, 3000 - 516), (4, 2996)]

    def test_a_short_turn_pays_one_big_batch_and_a_small_one(self) -> None:
        p = profile()
        assert list(p.prefill_steps(500, cached=17000)) == [(496, 17000), (4, 17496)]
        # 496 tokens pay the expert copy, the last 4 run on the CPU
        assert p.prefill_seconds(500, 17000) == pytest.approx(6.0 + 500 * 0.001)

    def test_without_checkpoints_the_steps_are_whole_batches(self) -> None:
        flat = profile(PrefillModel(token_s=0.001, ubatch=512, batch=2048))
        assert list(flat.prefill_steps(5000)) == [(2048, 0), (2048, 2048), (904, 4096)]

    @given(st.integers(1, 40_000), st.integers(0, 40_000), st.booleans())
    def test_steps_cover_the_prompt_exactly_and_respect_the_batch(
        self, new: int, cached: int, cuts: bool
    ) -> None:
        p = profile(PrefillModel(token_s=0.001, ubatch=512, batch=2048, checkpoint_splits=cuts))
        steps = list(p.prefill_steps(new, cached))
        assert sum(n for n, _ in steps) == new
        assert all(0 < n <= 2048 for n, _ in steps)
        assert [c for _, c in steps] == [cached + sum(n for n, _ in steps[:i]) for i in range(len(steps))]

    @given(st.integers(1, 20_000), st.integers(1, 20_000))
    def test_more_new_tokens_never_cost_less(self, a: int, b: int) -> None:
        p = profile()
        assert p.prefill_seconds(min(a, b)) <= p.prefill_seconds(max(a, b)) + 1e-9


class TestPrices:
    def test_a_linear_profile_is_the_two_constant_model(self) -> None:
        p = linear_profile("vllm", 6600, 64, batch_slowdown=0.06)
        assert p.prefill_seconds(6600) == pytest.approx(1.0)
        assert p.prefill_tok_s() == pytest.approx(6600)
        assert p.decode_step_seconds(5) == pytest.approx((1 / 64) * (1 + 0.06 * 4))
        assert p.batch_slowdown(5) == pytest.approx(1.24)

    def test_attention_grows_with_the_context(self) -> None:
        p = profile(PrefillModel(token_s=0.001, ubatch=512, batch=2048, context_s=0.0001))
        assert p.prefill_seconds(100, cached=20_000) > p.prefill_seconds(100, cached=0)
        assert p.decode_step_seconds(1, 0) == pytest.approx(0.03)

    def test_restores_cost_per_token(self) -> None:
        p = EngineProfile(
            name="t",
            engine="llamacpp",
            prefill=CPU_MOE,
            decode=DecodeModel(step_s=0.03),
            cache=CacheModel(ram_restore_token_s=3e-5),
        )
        assert p.ram_restore_seconds(8000) == pytest.approx(0.24)


class TestFit:
    def test_the_fit_recovers_a_batch_step_profile_from_its_own_points(self) -> None:
        truth = profile()
        grid = [(n, c) for n in (100, 600, 1500, 4096, 9000) for c in (0, 8000)]
        points = [Point(n, c, truth.prefill_seconds(n, c)) for n, c in grid]
        fitted = fit_prefill(CPU_MOE, points, attention=False)
        assert fitted.token_s == pytest.approx(0.001, rel=1e-6)
        assert fitted.batch_s == pytest.approx(6.0, rel=1e-6)

    def test_the_fit_never_goes_negative(self) -> None:
        points = [Point(1000, 0, 1.0), Point(2000, 0, 1.9), Point(4000, 0, 4.2)]
        fitted = fit_prefill(PrefillModel(token_s=1.0, ubatch=512, batch=2048), points)
        assert min(fitted.token_s, fitted.batch_s, fitted.context_s) >= 0

    def test_attention_alone_never_explains_a_prefill(self) -> None:
        """The tiny vLLM's timings under a busy run (make test-busy, run 3): the best fit with
        attention had no per-token cost, and calibrate refused the engine. Fitted again without
        attention, the rate is per token."""
        points = [
            Point(16, 0, 0.061394), Point(512, 0, 0.082289), Point(1024, 0, 0.066674),
            Point(1843, 0, 0.136784), Point(504, 384, 0.140789), Point(872, 768, 0.129686),
        ]  # fmt: skip
        shape = PrefillModel(token_s=1.0, batch_min=1, ubatch=2048, batch=2048)
        fitted = fit_prefill(shape, points, attention=True)
        assert fitted.token_s > 0
        assert fitted.context_s == 0

    def test_decode_fit_separates_the_batch_and_the_context(self) -> None:
        truth = DecodeModel(step_s=0.02, seq_s=0.004, context_s=0.0005)
        points = [
            Point(b, ctx, truth.step_s + (b - 1) * truth.seq_s + ctx / 1000 * truth.context_s)
            for b in (1, 2, 4)
            for ctx in (100, 4000, 16000)
        ]
        fitted = fit_decode(points)
        assert (fitted.step_s, fitted.seq_s, fitted.context_s) == pytest.approx(
            (0.02, 0.004, 0.0005), rel=1e-6
        )


class TestSchema:
    def test_round_trip_through_plain_data(self) -> None:
        p = EngineProfile(
            name="t",
            engine="llamacpp",
            prefill=CPU_MOE,
            decode=DecodeModel(step_s=0.03),
            machine=(("gpu", "H200"),),
            prefill_points=(Point(512, 0, 6.5),),
        )
        data = profile_to_mapping(p)
        assert data["machine"] == {"gpu": "H200"}
        assert profile_from_mapping(data) == p

    @pytest.mark.parametrize(
        ("change", "message"),
        [
            ({"schema": 2}, "schema 2 is not supported"),
            ({"engine": "tgi"}, "engine"),
            ({"prefill": {"token_s": -1}}, "prefill.token_s must be >= 0"),
            ({"prefill": {"token_s": 0}}, "token_s or prefill.batch_s must be > 0"),
            ({"decode": {"step_s": 0}}, "decode.step_s must be > 0"),
            ({"prefill": {"token_s": 1, "speed": 3}}, "speed"),
        ],
    )
    def test_bad_profiles_name_the_field(self, change: dict[str, object], message: str) -> None:
        data = {"name": "t", "engine": "llamacpp", "prefill": {"token_s": 0.001}, "decode": {"step_s": 0.01}}
        with pytest.raises(ProfileSchemaError, match=message):
            profile_from_mapping({**data, **change})
