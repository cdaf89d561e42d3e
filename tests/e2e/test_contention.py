"""More sessions than llama.cpp slots, end to end on the simulators: concurrent claims of one slot,
reuse found by content in one growing message, warm turns counted without a full count."""

from __future__ import annotations

import concurrent.futures
from collections.abc import Iterator
from typing import Any

import httpx
import pytest

from backends.sim import SimConfig
from policies import Architecture
from tests.e2e.conftest import Stack, start_stack, stop_stack
from tests.e2e.test_routing import text
from tests.servers import ADMIN


@pytest.fixture
def one_slot() -> Iterator[Stack]:
    """vLLM (hybrid, no prefix caching) and a llama.cpp with ONE slot, RAM cache on."""
    running = start_stack(
        vllm=SimConfig(
            kind="vllm",
            model="up-vllm",
            time_scale=0.01,
            prefix_caching=False,
            architecture=Architecture.HYBRID,
        ),
        llama=SimConfig(kind="llamacpp", model="up-llama", time_scale=0.01, slots=1, context_window=65536),
        profile="cost",
    )
    try:
        yield running
    finally:
        stop_stack(running)


def send(stack: Stack, messages: list[dict[str, Any]], session: str | None = None) -> httpx.Response:
    body = {"model": "m-both", "messages": messages, "max_tokens": 16, "stream": False}
    headers = {"x-session-id": session} if session else {}
    with stack.client() as client:
        response = client.post("/v1/chat/completions", json=body, headers=headers)
    assert response.status_code == 200, response.text
    return response


def decisions(stack: Stack, limit: int) -> list[dict[str, Any]]:
    with stack.client() as client:
        data: list[dict[str, Any]] = client.get(
            "/admin/api/decisions", headers=ADMIN, params={"limit": limit}
        ).json()["data"]
    return data


def test_concurrent_sessions_contend_for_one_slot(one_slot: Stack) -> None:
    """Four sessions, each warm-up then one turn sent at the same moment: every request completes,
    at most one is pinned to the slot at a time by lease, and each decision says where it went and why."""
    conversations = {
        name: [
            {"role": "system", "content": text(600, seed)},
            {"role": "user", "content": text(40, seed + 50)},
        ]
        for seed, name in enumerate("abcd")
    }
    for name, messages in conversations.items():
        first = send(one_slot, messages, name)
        messages.append(first.json()["choices"][0]["message"])
        messages.append({"role": "user", "content": "and then?"})
    with concurrent.futures.ThreadPoolExecutor(max_workers=4) as pool:
        responses = list(pool.map(lambda item: send(one_slot, item[1], item[0]), conversations.items()))
    assert all(r.status_code == 200 for r in responses)
    pinned = [r for r in responses if r.headers.get("x-turnout-slot") is not None]
    for response in pinned:
        assert response.headers["x-turnout-slot"] == "0"
        reason = response.headers["x-turnout-route-reason"]
        assert any(word in reason for word in ("warm slot 0", "takes slot 0", "waits", "lease expired")), (
            reason
        )
    # the llama.cpp simulator ran the pinned requests one after the other on its only slot
    events = [e for e in one_slot.events("llama") if e.kind == "start"]
    assert {e.slot for e in events} == {0}
    latest = decisions(one_slot, 4)
    assert all(entry["outcome"]["status"] == 200 for entry in latest)
    assert all(len(entry["candidates"]) == 2 for entry in latest)  # both engines were weighed, every time


def test_one_growing_message_finds_its_slot_without_session_ids(one_slot: Stack) -> None:
    """Mooncake-style: no session id, the conversation is ONE user message that grows. The prefix
    index recognises it (implicit session) and its turns reuse the llama.cpp slot's cache."""
    body = text(900, 7)
    responses = []
    for turn in range(4):
        body += " " + text(120, 20 + turn)
        responses.append(send(one_slot, [{"role": "user", "content": body}]))
    later = responses[1:]
    assert all(r.headers["x-turnout-session-source"] == "implicit" for r in later)
    on_llama = [r for r in later if r.headers["x-turnout-backend"] == "llama"]
    assert on_llama, [r.headers["x-turnout-route-reason"] for r in later]
    assert "warm slot 0" in on_llama[-1].headers["x-turnout-route-reason"]  # its session's own slot
    assert on_llama[-1].json()["usage"]["prompt_tokens_details"]["cached_tokens"] > 0


def test_a_warm_turn_is_counted_from_its_previous_prompt(one_slot: Stack) -> None:
    """A session's next turn is estimated as its previous exact prompt plus the new part."""
    messages = [{"role": "system", "content": text(400, 3)}, {"role": "user", "content": "first question"}]
    first = send(one_slot, messages, "counted")
    messages += [first.json()["choices"][0]["message"], {"role": "user", "content": "second question"}]
    second = send(one_slot, messages, "counted")
    entry = decisions(one_slot, 1)[0]
    assert entry["prompt_tokens_counted"] == "added"
    exact = second.json()["usage"]["prompt_tokens"]
    assert abs(entry["prompt_tokens_estimate"] - exact) <= 0.05 * exact


def test_near_the_window_a_warm_turn_tokenizes_only_what_it_added() -> None:
    """Both windows are 4096 tokens and the conversation is near them: the first turn is counted
    whole by an engine, the next one only by its new part (``/tokenize`` of that text)."""
    running = start_stack(
        vllm=SimConfig(kind="vllm", model="up-vllm", time_scale=0.002, context_window=4096),
        llama=SimConfig(kind="llamacpp", model="up-llama", time_scale=0.002, slots=1, context_window=4096),
        profile="prefer-llamacpp",
    )

    def counting_calls() -> list[tuple[str, bytes]]:
        return [
            (path, body)
            for tap in running.taps.values()
            for path, body in tap.posts
            if path == "/tokenize" or path.endswith("/input_tokens")
        ]

    try:
        messages = [{"role": "system", "content": text(1550, 4)}, {"role": "user", "content": "first"}]
        first = send(running, messages, "near")
        (whole,) = counting_calls()
        assert len(whole[1]) > 5000  # the whole conversation was counted
        messages += [
            first.json()["choices"][0]["message"],
            {"role": "user", "content": "the second question"},
        ]
        second = send(running, messages, "near")
        (added,) = counting_calls()[1:]
        assert added[0] == "/tokenize"
        assert b"the second question" in added[1]
        assert len(added[1]) < 400  # the new part, not the conversation
        entry = decisions(running, 1)[0]
        assert (entry["prompt_tokens_counted"], entry["prompt_tokens_exact"]) == ("added", True)
        exact = second.json()["usage"]["prompt_tokens"]
        assert abs(entry["prompt_tokens_estimate"] - exact) <= 0.02 * exact
    finally:
        stop_stack(running)
