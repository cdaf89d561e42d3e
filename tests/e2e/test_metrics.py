"""``GET /metrics``: parsed by prometheus_client's own parser, counting exactly what was sent."""

from __future__ import annotations

import gc
from collections import defaultdict

import openai
from prometheus_client.parser import text_string_to_metric_families

from tests.e2e.conftest import Stack


def scrape(stack: Stack) -> dict[str, dict[tuple[tuple[str, str], ...], float]]:
    with stack.client() as client:
        response = client.get("/metrics")
    assert response.status_code == 200
    assert response.headers["content-type"].startswith("text/plain; version=0.0.4")
    samples: dict[str, dict[tuple[tuple[str, str], ...], float]] = defaultdict(dict)
    for family in text_string_to_metric_families(response.text):
        for sample in family.samples:
            samples[sample.name][tuple(sorted(sample.labels.items()))] = sample.value
    return samples


def total(samples: dict[tuple[tuple[str, str], ...], float], **labels: str) -> float:
    return sum(v for k, v in samples.items() if set(labels.items()) <= set(k))


def test_counters_match_the_traffic_sent(stack: Stack) -> None:
    client = openai.OpenAI(base_url=stack.url + "/v1", api_key="k", max_retries=0)
    before = scrape(stack)
    usage: dict[str, list[int]] = {"vllm": [0, 0], "llama": [0, 0]}
    sent = [("m-vllm", "vllm", False), ("m-vllm", "vllm", True), ("m-llama", "llama", True),
            ("m-llama", "llama", True), ("m-llama", "llama", False)]  # fmt: skip
    for model, backend, stream in sent:
        if stream:
            chunks = list(client.chat.completions.create(
                model=model, messages=[{"role": "user", "content": "hi there"}], max_tokens=5, stream=True,
                stream_options={"include_usage": True},
            ))  # fmt: skip
            got = chunks[-1].usage
        else:
            got = client.chat.completions.create(
                model=model, messages=[{"role": "user", "content": "hi there"}], max_tokens=5
            ).usage
        assert got is not None
        usage[backend][0] += got.prompt_tokens
        usage[backend][1] += got.completion_tokens
    after = scrape(stack)

    def delta(name: str, **labels: str) -> float:
        return total(after[name], **labels) - total(before.get(name, {}), **labels)

    assert delta("turnout_requests_total", backend="vllm", status="200", endpoint="chat.completions") == 2
    assert delta("turnout_requests_total", backend="llama", status="200", model="m-llama") == 3
    # a whole body's first token is observed only where the engine reports its timings (llama.cpp,
    # whose simulator here reports simulated times 500 times the wall's: tests/e2e/test_ttft_truth.py)
    assert delta("turnout_ttft_seconds_count", backend="vllm") == 1
    assert delta("turnout_ttft_seconds_count", backend="llama") >= 2
    assert delta("turnout_request_duration_seconds_count", backend="vllm") == 2
    assert delta("turnout_ttft_prediction_error_seconds_count", backend="vllm") == 1
    for backend, (prompt, completion) in usage.items():
        assert delta("turnout_tokens_total", backend=backend, kind="prompt") == prompt
        assert delta("turnout_tokens_total", backend=backend, kind="completion") == completion
    assert total(after["turnout_backend_up"], backend="vllm", kind="vllm") == 1
    assert total(after["turnout_backend_health"], backend="llama", state="ready") == 1
    assert total(after["turnout_slots"], backend="llama") == 2
    assert "turnout_slot_leases" in after
    assert "turnout_backend_kv_usage_ratio" in after


def test_a_refused_request_is_counted_with_its_status(stack: Stack) -> None:
    before = scrape(stack)
    with stack.client() as client:
        assert (
            client.post("/v1/chat/completions", json={"model": "m-both", "messages": "no"}).status_code == 400
        )
    after = scrape(stack)
    refused = total(after["turnout_requests_total"], status="400") - total(
        before.get("turnout_requests_total", {}), status="400"
    )
    assert refused == 1


def test_garbage_collector_pauses_are_timed(stack: Stack) -> None:
    """``turnout_gc_pause_seconds``: every collection of the process, per generation, in buckets."""
    before = scrape(stack)
    gc.collect()  # a full collection: generation 2
    after = scrape(stack)
    full = (("generation", "2"),)
    assert after["turnout_gc_pause_seconds_count"][full] >= before["turnout_gc_pause_seconds_count"][full] + 1
    assert after["turnout_gc_pause_seconds_sum"][full] > before["turnout_gc_pause_seconds_sum"][full]
    buckets = {k: v for k, v in after["turnout_gc_pause_seconds_bucket"].items() if ("generation", "2") in k}
    by_bound = sorted((float(dict(k)["le"]), v) for k, v in buckets.items())
    assert [v for _, v in by_bound] == sorted(v for _, v in by_bound)  # cumulative
    assert by_bound[-1][1] == after["turnout_gc_pause_seconds_count"][full]
