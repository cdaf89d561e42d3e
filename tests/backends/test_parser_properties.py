"""Properties of the parsers of engine output: whatever an engine (or anything at its URL) sends,
they return a value or raise the one documented error (``ValueError``, which the probe turns into
"backend down"), and extra, missing or null fields never change what they read."""

from __future__ import annotations

import contextlib
import math
from typing import Any

from hypothesis import given
from hypothesis import strategies as st

from backends.parsers import llamacpp, vllm
from backends.parsers.openai import parse_models, parse_usage
from backends.parsers.prometheus import parse_samples
from policies import Usage

# the names the parsers look for, so generated objects hit their branches, not only unknown keys
NAMES = [
    "usage", "timings", "message", "response", "prompt_tokens", "completion_tokens", "total_tokens",
    "prompt_tokens_details", "cached_tokens", "input_tokens", "output_tokens", "cache_read_input_tokens",
    "cache_creation_input_tokens", "input_tokens_details", "prompt_n", "cache_n", "predicted_n",
    "prompt_ms", "predicted_ms", "data", "id", "max_model_len", "meta", "n_ctx", "is_processing",
    "total_slots", "default_generation_settings", "model_alias", "error",
]  # fmt: skip
scalars = (
    st.none()
    | st.booleans()
    | st.integers(min_value=-(10**400), max_value=10**400)  # msgspec decodes ints up to 4300 digits
    | st.floats(allow_nan=False, allow_infinity=False)  # what JSON can carry
    | st.text(max_size=8)
)
json_values = st.recursive(
    scalars,
    lambda inner: (
        st.lists(inner, max_size=4)
        | st.dictionaries(st.sampled_from(NAMES) | st.text(max_size=4), inner, max_size=6)
    ),
    max_leaves=30,
)
json_objects = st.dictionaries(st.sampled_from(NAMES), json_values, max_size=8)
counts = st.integers(min_value=0, max_value=10**7)
extras = st.dictionaries(st.text(max_size=6).filter(lambda k: k not in NAMES), json_values, max_size=4)


class TestUsage:
    @given(json_objects)
    def test_any_object_gives_usage_or_none(self, data: dict[str, Any]) -> None:
        usage = parse_usage(data)
        assert usage is None or isinstance(usage, Usage)
        if usage is not None:
            assert isinstance(usage.prompt_tokens, int)
            assert isinstance(usage.completion_tokens, int)
            for ms in (usage.prompt_ms, usage.predicted_ms):
                assert ms is None or math.isfinite(ms)

    @given(counts, counts, st.none() | counts, extras, extras)
    def test_openai_usage_with_extra_fields(
        self, prompt: int, completion: int, cached: int | None, more: dict[str, Any], around: dict[str, Any]
    ) -> None:
        """vLLM's final chunk or body: extra fields anywhere (and a null ``cached_tokens``) change nothing."""
        details = {"cached_tokens": cached}
        usage = {
            "prompt_tokens": prompt,
            "completion_tokens": completion,
            "prompt_tokens_details": details,
            **more,
        }
        assert parse_usage({**around, "choices": [], "usage": usage}) == Usage(prompt, completion, cached)

    @given(counts, counts, counts, st.floats(0, 1e7), st.floats(0, 1e7), extras)
    def test_llama_timings_alone(
        self, prompt_n: int, cache_n: int, predicted_n: int, prompt_ms: float, predicted_ms: float,
        more: dict[str, Any],
    ) -> None:  # fmt: skip
        """A llama.cpp stream without ``include_usage``: the final chunk's ``timings`` are all there is."""
        timings = {"prompt_n": prompt_n, "cache_n": cache_n, "predicted_n": predicted_n,
                   "prompt_ms": prompt_ms, "predicted_ms": predicted_ms, **more}  # fmt: skip
        assert parse_usage({"timings": timings}) == Usage(
            prompt_n + cache_n, predicted_n, cache_n, prompt_ms, predicted_ms
        )

    @given(counts, counts, counts, extras)
    def test_llama_usage_and_timings(
        self, prompt: int, completion: int, cache_n: int, more: dict[str, Any]
    ) -> None:
        """``usage`` wins for the counts; ``timings`` add the cache and the times; nulls are absent."""
        data = {"usage": {"prompt_tokens": prompt, "completion_tokens": completion, **more},
                "timings": {"cache_n": cache_n, "prompt_ms": None, "predicted_ms": 12}}  # fmt: skip
        assert parse_usage(data) == Usage(prompt, completion, cache_n, None, 12.0)

    @given(counts, counts, st.none() | counts, counts, st.sampled_from(["message", "response", None]))
    def test_anthropic_usage_wrapped_or_not(
        self, input_tokens: int, output: int, read: int | None, created: int, wrapper: str | None
    ) -> None:
        """Anthropic's input excludes cache reads and writes; turnout's prompt counts them all."""
        usage: dict[str, Any] = {"input_tokens": input_tokens, "output_tokens": output}
        if read is not None:
            usage |= {"cache_read_input_tokens": read, "cache_creation_input_tokens": created}
        data = {"usage": usage} if wrapper is None else {"type": "x", wrapper: {"id": "m", "usage": usage}}
        expected = (
            Usage(input_tokens + read + created, output, read)
            if read is not None
            else Usage(input_tokens, output)
        )
        assert parse_usage(data) == expected

    def test_numbers_json_allows_but_floats_do_not_hold_are_absent(self) -> None:
        """A 400-digit ``prompt_ms`` (msgspec decodes it) is no time at all, not an OverflowError."""
        usage = parse_usage({"timings": {"prompt_n": 3, "prompt_ms": 10**400, "predicted_ms": -(10**400)}})
        assert usage == Usage(3, 0, None, None, None)


def _value_error_or_result(parse: Any, data: Any) -> None:
    with contextlib.suppress(ValueError):  # documented: the probe marks the backend down
        parse(data)


class TestProbeParsers:
    """The probe catches ``ValueError`` (the backend is marked down); anything else would end it."""

    @given(json_values | json_objects | st.lists(json_objects, max_size=4))
    def test_slots_props_models(self, data: Any) -> None:
        for parse in (llamacpp.parse_slots, llamacpp.parse_props, parse_models):
            _value_error_or_result(parse, data)

    @given(
        st.lists(st.dictionaries(st.sampled_from(["id", "n_ctx", "is_processing"]), json_values), max_size=4)
    )
    def test_slots_with_odd_fields_are_read_or_skipped(self, slots: list[dict[str, Any]]) -> None:
        parsed = llamacpp.parse_slots(slots)
        assert all(isinstance(s.n_ctx, int) and isinstance(s.is_processing, bool) for s in parsed)

    @given(st.text())
    def test_metrics_text(self, text: str) -> None:
        parse_samples(text)
        vllm.parse_metrics(text)
        llamacpp.parse_metrics(text)

    @given(
        st.lists(
            st.tuples(
                st.from_regex(r"[a-z_:][a-z0-9_:]{0,12}", fullmatch=True),
                st.dictionaries(
                    st.from_regex(r"[a-z_][a-z0-9_]{0,6}", fullmatch=True), st.text(max_size=6), max_size=3
                ),
                st.floats(allow_nan=False, allow_infinity=False, width=32),
            ),
            max_size=6,
        )
    )
    def test_metrics_round_trip(self, samples: list[tuple[str, dict[str, str], float]]) -> None:
        """What the exposition format can say is read back: names, labels (escaped) and values."""
        escape = {"\\": "\\\\", '"': '\\"', "\n": "\\n"}
        lines = []
        for name, labels, value in samples:
            text = ",".join(f'{k}="{"".join(escape.get(c, c) for c in v)}"' for k, v in labels.items())
            lines.append(f"{name}{{{text}}} {value!r}" if labels else f"{name} {value!r}")
        parsed = parse_samples("\n".join(["# HELP x y", *lines]))
        assert [(s.name, dict(s.labels), s.value) for s in parsed] == samples
