"""Pure parsers over recorded engine texts."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from backends.errors import parse_error_body
from backends.parsers import llamacpp, vllm
from backends.parsers.openai import ServedModel, parse_models, parse_usage
from backends.parsers.prometheus import parse_samples, sum_by_name
from policies import SlotState, Usage

FIXTURES = Path(__file__).parent / "fixtures"


def fixture(name: str) -> str:
    return (FIXTURES / name).read_text()


class TestPrometheus:
    def test_labels_with_escapes_and_commas(self) -> None:
        text = 'm{a="x,y",b="q\\"z\\\\"} 2.5\nplain 3 1700000000\n'
        samples = parse_samples(text)
        assert samples[0].labels == (("a", "x,y"), ("b", 'q"z\\'))
        assert samples[0].value == 2.5
        assert (samples[1].name, samples[1].value) == ("plain", 3.0)

    def test_garbage_lines_are_skipped(self) -> None:
        assert [s.name for s in parse_samples("not a metric line\nok 1\nbad{x=1} 2\n")] == ["ok"]


def test_vllm_metrics() -> None:
    """Recorded from the real vLLM while one long generation ran: one running, none waiting, some KV
    in use, and the prefix-cache counters are the summed samples."""
    text = fixture("vllm_metrics.txt")
    metrics = vllm.parse_metrics(text)
    assert (metrics.running, metrics.waiting) == (1, 0)
    assert metrics.kv_cache_usage is not None
    assert 0 < metrics.kv_cache_usage < 1
    totals = sum_by_name(parse_samples(text))
    assert metrics.prefix_cache_queries == totals["vllm:prefix_cache_queries_total"] > 0
    assert metrics.prefix_cache_hits == totals["vllm:prefix_cache_hits_total"]
    assert metrics.prefix_cache_hits <= metrics.prefix_cache_queries


def test_vllm_reports_the_block_its_prefix_cache_hits_come_in() -> None:
    """``vllm:cache_config_info`` of the recording: blocks of 64 tokens, prefix caching on. The largest
    of the block labels counts (what turnout learns of the hits can only lower it); none with prefix
    caching off."""
    text = fixture("vllm_metrics.txt")
    assert vllm.parse_metrics(text).cache_block == 64
    info = 'vllm:cache_config_info{{block_size="16",effective_attention_block_size="{a}",' \
        'cache_hit_alignment_tokens="{h}",enable_prefix_caching="{on}"}} 1.0'  # fmt: skip
    assert vllm.parse_metrics(info.format(a="528", h="None", on="True")).cache_block == 528
    assert vllm.parse_metrics(info.format(a="16", h="1024", on="True")).cache_block == 1024
    assert vllm.parse_metrics(info.format(a="528", h="None", on="False")).cache_block is None


def test_vllm_reports_what_its_kv_cache_holds() -> None:
    """The prefix cache's bound: ``kv_cache_size_tokens`` where the server says it (the recording's
    hybrid model: 883,011), else ``num_gpu_blocks * block_size``; none with prefix caching off."""
    assert vllm.parse_metrics(fixture("vllm_metrics.txt")).cache_tokens == 883_011
    info = 'vllm:cache_config_info{{block_size="16",num_gpu_blocks="{n}",enable_prefix_caching="{on}"}} 1.0'
    assert vllm.parse_metrics(info.format(n="4096", on="True")).cache_tokens == 65_536
    assert vllm.parse_metrics(info.format(n="None", on="True")).cache_tokens is None
    assert vllm.parse_metrics(info.format(n="4096", on="False")).cache_tokens is None


def test_vllm_metrics_of_an_idle_server_without_counters() -> None:
    assert vllm.parse_metrics("") == vllm.VllmMetrics(0, 0, None, None, None)


def test_llama_metrics() -> None:
    """Recorded while slot 1 generated: one request processing, none deferred."""
    metrics = llamacpp.parse_metrics(fixture("llama_metrics.txt"))
    assert (metrics.processing, metrics.deferred) == (1, 0)
    assert metrics.prompt_tokens is not None
    assert metrics.prompt_tokens_cached is not None


def test_llama_slots_and_props() -> None:
    slots = llamacpp.parse_slots(json.loads(fixture("llama_slots.json")))
    # a slot's last task and the prompt its cache holds (backends.slot_watch): none yet on slot 0
    assert slots == (SlotState(0, 2048, False), SlotState(1, 2048, True, task=14, tokens=13))
    props = llamacpp.parse_props(json.loads(fixture("llama_props.json")))
    assert props == llamacpp.LlamaProps(total_slots=2, n_ctx=2048, model_alias="tiny-qwen35")


@pytest.mark.parametrize("bad", [{}, {"total_slots": "2"}, []])
def test_llama_props_rejects_other_json(bad: object) -> None:
    with pytest.raises(ValueError, match="total_slots"):
        llamacpp.parse_props(bad)


def test_models_of_both_engines() -> None:
    assert parse_models(json.loads(fixture("vllm_models.json"))) == (ServedModel("tiny-qwen3next", 2048),)
    assert parse_models(json.loads(fixture("llama_models.json"))) == (ServedModel("tiny-qwen35", 2048),)
    with pytest.raises(ValueError, match="data"):
        parse_models({"object": "list"})


class TestUsage:
    def test_openai_usage_with_cached_tokens(self) -> None:
        data = {
            "usage": {
                "prompt_tokens": 600,
                "completion_tokens": 8,
                "prompt_tokens_details": {"cached_tokens": 512},
            }
        }
        assert parse_usage(data) == Usage(600, 8, 512)

    def test_llama_timings_alone(self) -> None:
        data = {
            "timings": {
                "cache_n": 90,
                "prompt_n": 10,
                "prompt_ms": 4.5,
                "predicted_n": 5,
                "predicted_ms": 40.0,
            }
        }
        assert parse_usage(data) == Usage(100, 5, 90, 4.5, 40.0)

    def test_usage_and_timings(self) -> None:
        data = {
            "usage": {"prompt_tokens": 100, "completion_tokens": 5},
            "timings": {
                "cache_n": 90,
                "prompt_n": 10,
                "prompt_ms": 4.5,
                "predicted_n": 5,
                "predicted_ms": 40.0,
            },
        }
        assert parse_usage(data) == Usage(100, 5, 90, 4.5, 40.0)

    def test_anthropic(self) -> None:
        usage = {"input_tokens": 10, "cache_read_input_tokens": 90, "output_tokens": 5}
        assert parse_usage({"usage": usage}) == Usage(100, 5, 90)
        assert parse_usage({"type": "message_start", "message": {"usage": usage}}) == Usage(100, 5, 90)

    def test_responses(self) -> None:
        usage = {"input_tokens": 100, "output_tokens": 5, "input_tokens_details": {"cached_tokens": 64}}
        assert parse_usage({"usage": usage}) == Usage(100, 5, 64)
        assert parse_usage({"type": "response.completed", "response": {"usage": usage}}) == Usage(100, 5, 64)

    def test_anthropic_stream_usage_is_merged(self) -> None:
        from backends.stream import merge_usage

        start = parse_usage(
            {"message": {"usage": {"input_tokens": 10, "cache_read_input_tokens": 90, "output_tokens": 1}}}
        )
        delta = parse_usage({"type": "message_delta", "usage": {"output_tokens": 7}})
        assert merge_usage(start, delta) == Usage(100, 7, 90)

    def test_nothing(self) -> None:
        assert parse_usage({"choices": []}) is None


@pytest.mark.parametrize(
    ("status", "body", "message", "type_"),
    [
        (401, b'{"error":"Unauthorized"}', "Unauthorized", None),
        (
            400,
            b'{"error":{"code":400,"message":"request (9 tokens) exceeds the available context size'
            b' (8 tokens), try increasing it","type":"exceed_context_size_error",'
            b'"n_prompt_tokens":9,"n_ctx":8}}',
            "request (9 tokens) exceeds the available context size (8 tokens), try increasing it",
            "exceed_context_size_error",
        ),
        (404, b'{"detail":"Not Found"}', "Not Found", None),
        (422, b'{"detail":[{"msg":"field required"}]}', "field required", None),
        (502, b"<html>bad gateway</html>", "<html>bad gateway</html>", None),
        (503, b"", "HTTP 503", None),
    ],
)
def test_error_bodies(status: int, body: bytes, message: str, type_: str | None) -> None:
    error = parse_error_body("b", status, body)
    assert (error.status, error.message, error.error_type) == (status, message, type_)


def test_llama_context_error_keeps_its_numbers() -> None:
    body = (
        b'{"error":{"code":400,"message":"m","type":"exceed_context_size_error",'
        b'"n_prompt_tokens":9,"n_ctx":8}}'
    )
    assert parse_error_body("b", 400, body).extra == {"n_prompt_tokens": 9, "n_ctx": 8}


def test_llama_recorded_responses_give_usage() -> None:
    """The non-streamed body and the stream's final event both carry usage and timings."""
    body = json.loads(fixture("llama_chat.json"))
    usage = parse_usage(body)
    assert usage is not None
    assert usage.prompt_tokens == body["usage"]["prompt_tokens"]
    assert usage.cached_tokens == body["timings"]["cache_n"]
    events = [e for e in fixture("llama_chat_stream.txt").split("\n\n") if e]
    assert events[-1] == "data: [DONE]"
    last = json.loads(events[-2].removeprefix("data: "))
    stream_usage = parse_usage(last)
    assert stream_usage is not None
    assert stream_usage.completion_tokens == last["timings"]["predicted_n"]


def test_vllm_recorded_responses_give_usage() -> None:
    """The non-streamed body and the stream's usage chunk (``include_usage``) carry cached tokens."""
    body = json.loads(fixture("vllm_chat.json"))
    usage = parse_usage(body)
    assert usage == Usage(
        body["usage"]["prompt_tokens"],
        body["usage"]["completion_tokens"],
        body["usage"]["prompt_tokens_details"]["cached_tokens"],
    )
    events = [e for e in fixture("vllm_chat_stream.txt").split("\n\n") if e]
    assert events[-1] == "data: [DONE]"
    chunks = [json.loads(e.removeprefix("data: ")) for e in events[:-1]]
    assert all(parse_usage(c) is None for c in chunks[:-1])
    last = chunks[-1]
    assert last["choices"] == []
    assert parse_usage(last) == Usage(
        last["usage"]["prompt_tokens"],
        last["usage"]["completion_tokens"],
        last["usage"]["prompt_tokens_details"]["cached_tokens"],
    )


def test_vllm_recorded_context_error() -> None:
    error = parse_error_body("b", 400, fixture("vllm_error_context.json").encode())
    assert error.error_type == "BadRequestError"
    assert error.message.startswith("This model's maximum context length is 2048 tokens.")


def test_vllm_context_error_is_recognised() -> None:
    body = (
        b'{"error":{"message":"This model\'s maximum context length is 2048 tokens.",'
        b'"type":"BadRequestError","param":"input_tokens","code":400}}'
    )
    error = parse_error_body("vllm", 400, body)
    assert (error.param, error.context_exceeded) == ("input_tokens", True)
    assert not parse_error_body(
        "vllm", 400, b'{"error":{"message":"m","param":"max_tokens"}}'
    ).context_exceeded


def test_context_sizes_from_either_engine() -> None:
    llama = (
        b'{"error":{"code":400,"message":"m","type":"exceed_context_size_error",'
        b'"n_prompt_tokens":9,"n_ctx":8}}'
    )
    assert parse_error_body("b", 400, llama).context_sizes() == (9, 8)
    vllm = parse_error_body("b", 400, fixture("vllm_error_context.json").encode())
    assert vllm.context_sizes()[1] == 2048
    newer = (
        b'{"error":{"message":"This model\'s maximum context length is 4096 tokens. However, your prompt '
        b'contains at least 4097 input tokens, which exceeds this limit even without any output tokens.",'
        b'"type":"BadRequestError","param":"input_tokens","code":400}}'
    )
    assert parse_error_body("b", 400, newer).context_sizes() == (4097, 4096)
    assert parse_error_body("b", 400, b'{"error":{"message":"m"}}').context_sizes() == (None, None)


def test_vllm_025_reports_its_hybrid_block_and_pool() -> None:
    """vLLM 0.25 serving the 27B's shape on an H100 with an fp8 KV cache (its ``/metrics``, saved by
    ``bench/gpu/vllm.sh turns``): the raised 1,568-token block and the pool's tokens are read as such."""
    text = (Path(__file__).parents[2] / "bench/gpu/results/2026-12-06d-h100/metrics-vllm-fp8.txt").read_text()
    metrics = vllm.parse_metrics(text)
    assert (metrics.cache_block, metrics.cache_tokens) == (1568, 1_022_634)
