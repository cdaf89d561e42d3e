"""llama-server ends a prefill step where the prompt's last user message starts (with context
checkpoints on: the pinned server's prompt loop), so a warm chat turn that re-processes the previous
answer and then a new user message pays two micro-batches (``EngineProfile.step_tokens``'s
``user_start``). Pinned to the H100 run of Flash-Next's shape (bench/gpu/results/2026-12-06e-h100):
its warm turns are within 10% with the split and 30-40% under without it."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from backends.engine_profiles import load_profile
from backends.sim.requests import Endpoint, parse_request
from policies import Endpoint as Api
from policies.features import ModelFacts, request_features

RUN = Path(__file__).resolve().parents[2] / "bench/gpu/results/2026-12-06e-h100/turns-h100-profile.json"
ANSWER_TOKENS = 128 + 5  # the previous answer and its chat template, re-processed from the checkpoint


def test_a_step_ends_where_the_last_user_message_starts() -> None:
    profile = load_profile("h100-llamacpp-flash-next-shape-mmap2048")
    assert list(profile.prefill_steps(468, 1063)) == [(464, 1063), (4, 1527)]
    assert list(profile.prefill_steps(468, 1063, user_start=1196)) == [(133, 1063), (331, 1196), (4, 1527)]
    assert list(profile.prefill_steps(468, 1063, user_start=500)) == [(464, 1063), (4, 1527)]  # in the cache
    cold = load_profile("seed-5090-llamacpp-27b")  # no checkpoint splits: a user message ends nothing
    assert list(cold.prefill_steps(468, 1063, user_start=1196)) == list(cold.prefill_steps(468, 1063))


def test_the_measured_warm_chat_turns_need_the_split() -> None:
    profile = load_profile("h100-llamacpp-flash-next-shape-mmap2048")
    rows = json.loads(RUN.read_text())["rows"]
    warm = [r for r in rows if r.get("kind") == "turn" and r["cached_tokens"] > 0]
    assert len(warm) == 4
    for row in warm:
        new, cached = row["prompt_tokens"] - row["cached_tokens"], row["cached_tokens"]
        measured = row["engine_prompt_ms"] / 1000
        split = profile.prefill_seconds(new, cached, user_start=cached + ANSWER_TOKENS)
        plain = profile.prefill_seconds(new, cached)
        assert split == pytest.approx(measured, rel=0.10), row
        assert abs(plain / measured - 1) > 0.15, row


def test_the_router_and_the_simulator_find_the_last_user_message() -> None:
    messages = [
        {"role": "system", "content": "be brief"},
        {"role": "user", "content": "explain the layout " * 40},
        {"role": "assistant", "content": "it has three packages"},
        {"role": "user", "content": "and the tests?"},
    ]
    features = request_features({"model": "m", "messages": messages}, Api.CHAT, {}, ModelFacts("m"))
    assert 0.8 < features.user_start / features.prompt_tokens < 1.0
    text = request_features({"model": "m", "prompt": "x " * 50}, Api.COMPLETIONS, {}, ModelFacts("m"))
    assert text.user_start == -1
    tool_results = [  # Claude Code's turns: the tools' output in a user message is no user message
        {"role": "user", "content": "fix the failing test " * 40},
        {"role": "assistant", "content": [{"type": "tool_use", "id": "t1", "name": "read", "input": {}}]},
        {"role": "user", "content": [{"type": "tool_result", "tool_use_id": "t1", "content": "x " * 300}]},
    ]
    agent = request_features({"model": "m", "messages": tool_results, "max_tokens": 8}, Api.MESSAGES, {},
                             ModelFacts("m"))  # fmt: skip
    assert agent.user_start == -1  # the only real user message starts the prompt
    asked_again = [*tool_results, {"role": "user", "content": [{"type": "text", "text": "and now?"}]}]
    again = request_features({"model": "m", "messages": asked_again, "max_tokens": 8}, Api.MESSAGES, {},
                             ModelFacts("m"))  # fmt: skip
    assert again.user_start > 0.9 * again.prompt_tokens
    request = parse_request({"messages": messages}, Endpoint.CHAT, llama=True)
    assert 0.8 < request.user_start / len(request.prompt) < 1.0
    one = parse_request({"messages": messages[1:2]}, Endpoint.CHAT, llama=True)
    assert one.user_start == -1  # the only user message starts the prompt: nothing to end there


def test_the_router_and_the_simulator_find_the_first_user_message() -> None:
    """Where a cold prompt's first user message starts (llama-server checkpoints it: the end of the
    system prompt, which the next session sharing it restores): after the system prompt, in both."""
    system = {"role": "system", "content": "you are a careful coding agent " * 60}
    messages = [
        system,
        {"role": "user", "content": "explain the layout " * 40},
        {"role": "assistant", "content": "it has three packages"},
        {"role": "user", "content": "and the tests?"},
    ]
    features = request_features({"model": "m", "messages": messages}, Api.CHAT, {}, ModelFacts("m"))
    first, last = features.first_user_start, features.user_start
    assert 0.5 < first / features.prompt_tokens < 0.9 < last / features.prompt_tokens
    request = parse_request({"messages": messages}, Endpoint.CHAT, llama=True)
    assert 0.5 < request.first_user / len(request.prompt) < 0.9
    assert request.first_user < request.user_start
    claude = [  # Claude Code: the system prompt apart, the tools' output in user messages is no user message
        {"role": "user", "content": "fix the failing test " * 40},
        {"role": "assistant", "content": [{"type": "tool_use", "id": "t1", "name": "read", "input": {}}]},
        {"role": "user", "content": [{"type": "tool_result", "tool_use_id": "t1", "content": "x " * 300}]},
    ]
    body = {"model": "m", "system": system["content"], "messages": claude, "max_tokens": 8}
    agent = request_features(body, Api.MESSAGES, {}, ModelFacts("m"))
    assert agent.first_user_start == agent.user_start > 0  # one real user message, after the system prompt
    no_system = request_features(
        {"model": "m", "messages": claude, "max_tokens": 8}, Api.MESSAGES, {}, ModelFacts("m")
    )
    assert no_system.first_user_start == -1  # it starts the prompt: nothing before it to keep


def test_a_user_message_that_starts_the_prompt_is_not_one_the_server_breaks_at() -> None:
    """llama-server looks for a user message's start after each token it adds, so one at position 0 is
    never seen: without a system prompt the first it checkpoints on a cold prompt is the next user
    message, in the router and the simulator alike; with tools, the tools block comes first, so the
    only user message starts past it in both."""
    messages = [
        {"role": "user", "content": "explain the layout " * 40},
        {"role": "assistant", "content": "it has three packages"},
        {"role": "user", "content": "and the tests? " * 10},
    ]
    features = request_features({"model": "m", "messages": messages}, Api.CHAT, {}, ModelFacts("m"))
    assert features.first_user_start == features.user_start > 0.6 * features.prompt_tokens
    request = parse_request({"messages": messages}, Endpoint.CHAT, llama=True)
    assert request.first_user == request.user_start > 0.6 * len(request.prompt)
    tools = [{"type": "function", "function": {"name": "read", "parameters": {"type": "object"}}}]
    body = {"model": "m", "messages": messages[:1], "tools": tools}
    routed = request_features(body, Api.CHAT, {}, ModelFacts("m"))
    simulated = parse_request(body, Endpoint.CHAT, llama=True)
    assert routed.first_user_start == routed.user_start > 0
    assert simulated.first_user == simulated.user_start > 0


def test_two_sessions_on_one_system_prompt_have_one_head() -> None:
    """The head (the prompt's bytes up to its first user message) is what a new session must share
    with a slot's cold prompt to restore the checkpoint taken there: the same system prompt and tools
    give the same head, whatever follows; another tool list another one."""
    system = {"role": "system", "content": "you are a careful coding agent " * 60}
    tools = [{"type": "function", "function": {"name": "read", "parameters": {"type": "object"}}}]

    def head_of(question: str, tool_list: list[dict[str, Any]]) -> Any:
        body = {"model": "m", "messages": [system, {"role": "user", "content": question}], "tools": tool_list}
        return request_features(body, Api.CHAT, {}, ModelFacts("m")).head

    first, second = head_of("fix the parser " * 30, tools), head_of("why is CI red?", tools)
    assert first is not None
    assert first == second
    assert head_of("why is CI red?", [*tools, {"type": "function", "function": {"name": "edit"}}]) != first
    bare = request_features({"model": "m", "messages": [{"role": "user", "content": "hi"}]}, Api.CHAT, {},
                            ModelFacts("m"))  # fmt: skip
    assert bare.head is None  # nothing before its only user message
