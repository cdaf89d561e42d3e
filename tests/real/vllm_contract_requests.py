"""What ``test_vllm_contract.py`` sends to the real vLLM and to turnout's simulator, and how it
compares them: the served model's name, window and API key, the metrics turnout reads, the request
bodies (OpenAI and the agents' Anthropic Messages and OpenAI Responses), the same request to both
servers (``both``) and their answers' shapes compared (``assert_same_shape``,
``first_and_last_by_name``).
"""

from __future__ import annotations

from typing import Any

import httpx

from tests.real.shapes import differences, shape

MODEL = "tiny-qwen3next"
MAX_MODEL_LEN = 2048
API_KEY = "contract-key"
MESSAGES = [{"role": "user", "content": "Say something about routers."}]
# The metrics turnout's vLLM parser reads, and the counters a dashboard expects next to them.
READ_BY_TURNOUT = {
    "vllm:num_requests_running",
    "vllm:num_requests_waiting",
    "vllm:kv_cache_usage_perc",
    "vllm:prefix_cache_queries_total",
    "vllm:prefix_cache_hits_total",
    "vllm:cache_config_info",
}
COMMON_COUNTERS = {
    "vllm:prompt_tokens_total",
    "vllm:generation_tokens_total",
    "vllm:prompt_tokens_cached_total",
    "vllm:num_preemptions_total",
    "vllm:request_success_total",
}

Pair = tuple[httpx.Client, httpx.Client]


def both(pair: Pair, method: str, path: str, **kwargs: Any) -> list[httpx.Response]:
    return [client.request(method, path, **kwargs) for client in pair]


def assert_same_shape(real: Any, sim: Any) -> None:
    found = differences(shape(real), shape(sim))
    assert not found, "\n".join(found)


def generation_body(path: str, **extra: Any) -> dict[str, Any]:
    """``ignore_eos``: the random model may otherwise stop after one token (the simulator ignores it)."""
    body: dict[str, Any] = {"model": MODEL, "max_tokens": 6, "temperature": 0, "ignore_eos": True}
    body |= {"messages": MESSAGES} if "chat" in path else {"prompt": "Once upon a time"}
    return body | extra


MESSAGES_BODY = {
    "model": MODEL,
    "max_tokens": 6,
    "messages": MESSAGES,
    "system": "Be brief.",
    "temperature": 0,
}  # no ``ignore_eos``: vLLM's Anthropic conversion drops it (greedy decoding runs the 6 tokens anyway)
RESPONSES_BODY = {
    "model": MODEL,
    "max_output_tokens": 6,
    "input": "Say something about routers.",
    "temperature": 0,
    "ignore_eos": True,
}
AGENT_BODIES = [("/v1/messages", MESSAGES_BODY), ("/v1/responses", RESPONSES_BODY)]


def first_and_last_by_name(events: list[tuple[str, dict[str, Any]]]) -> dict[str, list[dict[str, Any]]]:
    by_name: dict[str, list[dict[str, Any]]] = {}
    for name, data in events:
        by_name.setdefault(name, []).append(data)
    return {name: [found[0], found[-1]] for name, found in by_name.items()}


LONG = "route " * 3000
