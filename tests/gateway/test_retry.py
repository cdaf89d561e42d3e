"""The one step after a failure before any byte (``gateway.retry``), which the relay and the virtual
replay share: retry where another backend may do better, give up otherwise, and say what the failure
means for the engine."""

from __future__ import annotations

from backends.errors import UpstreamStatusError, UpstreamStreamError, UpstreamUnavailable
from gateway.errors import ContextLengthExceeded, ModelNotFound
from gateway.retry import after_failure, gave_up
from gateway.routed import Routed
from policies import Decision, Endpoint, Reason, extract

FEATURES = extract(
    {"model": "m", "messages": [{"role": "user", "content": "x" * 3600}]}, Endpoint.CHAT, model="m"
)
ROUTED = Routed(Decision("cost", None, Reason.NO_CANDIDATE), FEATURES, None)


def overflow(backend: str = "llama") -> UpstreamStatusError:
    extra = {"n_prompt_tokens": 1234, "n_ctx": 1024}
    return UpstreamStatusError(
        backend, 400, "the request exceeds the context", "exceed_context_size_error", extra
    )


def test_an_overflow_goes_elsewhere_on_the_engine_s_count_and_is_not_the_engine_s_fault() -> None:
    verdict = after_failure(overflow(), ROUTED, attempt=1, retries=2)
    assert verdict.retry is not None
    assert verdict.retry.features.prompt_tokens == 1234
    assert verdict.retry.features.prompt_exact
    assert verdict.retry.overflowed == ("llama",)
    assert verdict.exclude == "llama"
    assert verdict.fault is None
    assert not verdict.unreachable


def test_an_unreachable_engine_is_avoided_and_the_request_retried() -> None:
    verdict = after_failure(UpstreamUnavailable("vllm", "connection refused"), ROUTED, attempt=1, retries=1)
    assert verdict.unreachable
    assert verdict.fault == "connection refused"
    assert verdict.retry is ROUTED


def test_a_5xx_is_the_engine_s_fault_and_retried_a_4xx_is_neither() -> None:
    five = after_failure(UpstreamStatusError("vllm", 503, "overloaded"), ROUTED, attempt=1, retries=1)
    assert five.fault == "overloaded"
    assert five.retry is ROUTED
    four = after_failure(UpstreamStatusError("vllm", 422, "bad tool schema"), ROUTED, attempt=1, retries=1)
    assert four.fault is None
    assert four.retry is None


def test_no_retry_past_the_configured_count() -> None:
    assert after_failure(overflow(), ROUTED, attempt=3, retries=2).retry is None
    assert after_failure(UpstreamStreamError("vllm", "reset"), ROUTED, attempt=1, retries=0).retry is None


def test_giving_up_says_too_long_after_an_overflow_else_the_last_failure_else_the_refusal() -> None:
    too_long = gave_up(ROUTED, overflow())
    assert isinstance(too_long, ContextLengthExceeded)
    assert "too long for every backend" in too_long.message
    last = UpstreamUnavailable("vllm", "connection refused")
    assert gave_up(ROUTED, last) is last
    assert isinstance(gave_up(ROUTED, None), ModelNotFound)  # no backend serves it: no rejections
