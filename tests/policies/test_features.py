"""Feature extraction reads only what routing needs, and estimates tokens from characters."""

from __future__ import annotations

import pytest

from policies import Endpoint, extract
from policies.features import (
    MESSAGE_OVERHEAD_TOKENS,
    estimate_prompt_tokens,
    requested_max_tokens,
    with_shape,
)


def test_chat_estimate_counts_text_parts_tool_calls_and_tools() -> None:
    body = {
        "messages": [
            {"role": "system", "content": "x" * 40},
            {"role": "user", "content": [{"type": "text", "text": "y" * 40}, {"type": "image_url"}]},
            {
                "role": "assistant",
                "content": None,
                "tool_calls": [{"function": {"name": "ab", "arguments": "cd"}}],
            },
        ],
    }
    assert estimate_prompt_tokens(body, Endpoint.CHAT, 4.0) == 21 + 3 * MESSAGE_OVERHEAD_TOKENS
    with_tools = {**body, "tools": [{"type": "function", "function": {"name": "f"}}]}
    assert estimate_prompt_tokens(with_tools, Endpoint.CHAT, 4.0) > estimate_prompt_tokens(
        body, Endpoint.CHAT, 4.0
    )


@pytest.mark.parametrize(("prompt", "expected"), [("a" * 400, 100), (["a" * 200, "b" * 200], 100), ("", 1)])
def test_completion_estimate(prompt: str | list[str], expected: int) -> None:
    assert estimate_prompt_tokens({"prompt": prompt}, Endpoint.COMPLETIONS, 4.0) == expected


@pytest.mark.parametrize(
    ("body", "expected"),
    [
        ({"max_tokens": 10}, 10),
        ({"max_completion_tokens": 7, "max_tokens": 10}, 7),
        ({"n_predict": 3}, 3),
        ({"max_tokens": True}, None),
        ({"max_tokens": -1}, None),
        ({}, None),
    ],
)
def test_max_tokens(body: dict[str, object], expected: int | None) -> None:
    assert requested_max_tokens(body) == expected


def test_extract() -> None:
    features = extract({"stream": True, "max_tokens": 5, "prompt": "abcd"}, Endpoint.COMPLETIONS, model="m")
    assert (features.model, features.stream, features.max_tokens) == ("m", True, 5)


def test_the_shape_can_wait_until_the_request_is_sent() -> None:
    """Routing needs no shape; ``with_shape`` adds the one ``extract`` would have made, where there is one."""
    chat = {"model": "m", "messages": [{"role": "user", "content": "hi"}], "tools": [{"name": "read"}]}
    routed = extract(chat, Endpoint.CHAT, model="m", shape=False)
    assert routed.shape is None
    assert with_shape(routed, chat) == extract(chat, Endpoint.CHAT, model="m")
    completion = extract({"model": "m", "prompt": "hi"}, Endpoint.COMPLETIONS, model="m", shape=False)
    assert with_shape(completion, {"model": "m", "prompt": "hi"}).shape is None


def test_a_prompt_of_token_ids_is_counted_exactly() -> None:
    """``/v1/completions`` with ``prompt: [ids]`` (what the engines accept): its count is its length."""
    features = extract({"prompt": list(range(1000)), "max_tokens": 4}, Endpoint.COMPLETIONS, model="m")
    assert (features.prompt_tokens, features.prompt_exact, features.prompt_counted) == (1000, True, "counted")
    text = extract({"prompt": "x" * 3600}, Endpoint.COMPLETIONS, model="m")
    assert (text.prompt_tokens, text.prompt_exact) == (1000, False)
