"""Anthropic Messages over chat completions: the request and the answer, translated both ways."""

from __future__ import annotations

import json

from backends.anthropic_chat import StreamTranslator, to_chat, to_message


def test_request_translation() -> None:
    body = {
        "system": [{"type": "text", "text": "Be brief."}],
        "max_tokens": 20,
        "stop_sequences": ["END"],
        "tool_choice": {"type": "any"},
        "tools": [{"name": "f", "description": "d", "input_schema": {"type": "object"}}],
        "messages": [
            {"role": "user", "content": "hi"},
            {
                "role": "assistant",
                "content": [{"type": "tool_use", "id": "t1", "name": "f", "input": {"a": 1}}],
            },
            {"role": "user", "content": [{"type": "tool_result", "tool_use_id": "t1", "content": "done"}]},
        ],
        "metadata": {"user_id": "u"},
    }
    chat = to_chat(body)
    assert chat["messages"] == [
        {"role": "system", "content": "Be brief."},
        {"role": "user", "content": "hi"},
        {"role": "assistant", "content": "", "tool_calls": [
            {"id": "t1", "type": "function", "function": {"name": "f", "arguments": '{"a":1}'}}
        ]},
        {"role": "tool", "tool_call_id": "t1", "content": "done"},
    ]  # fmt: skip
    assert (chat["max_tokens"], chat["stop"], chat["tool_choice"]) == (20, ["END"], "required")
    assert chat["tools"][0]["function"]["parameters"] == {"type": "object"}
    assert "metadata" not in chat


def test_answer_translation() -> None:
    chat = {
        "id": "chatcmpl-abc",
        "choices": [{"finish_reason": "tool_calls", "message": {"content": "Let me look.", "tool_calls": [
            {"id": "c1", "function": {"name": "f", "arguments": '{"a": 2}'}}
        ]}}],
        "usage": {"prompt_tokens": 100, "completion_tokens": 7},
        "timings": {"cache_n": 90, "prompt_n": 10, "predicted_n": 7},
    }  # fmt: skip
    message = to_message(chat, "m")
    assert message["id"] == "msg_abc"
    assert message["stop_reason"] == "tool_use"
    assert message["content"] == [
        {"type": "text", "text": "Let me look."},
        {"type": "tool_use", "id": "c1", "name": "f", "input": {"a": 2}},
    ]
    assert message["usage"] == {"cache_read_input_tokens": 90, "input_tokens": 10, "output_tokens": 7}


def events(raw: list[bytes]) -> list[tuple[str, dict[str, object]]]:
    out = []
    for event in raw:
        name, data = event.decode().strip().split("\n")
        out.append((name.removeprefix("event: "), json.loads(data.removeprefix("data: "))))
    return out


def test_stream_translation() -> None:
    translator = StreamTranslator("m")
    chunks = [
        {"id": "chatcmpl-x", "choices": [{"index": 0, "delta": {"role": "assistant", "content": None}}]},
        {"id": "chatcmpl-x", "choices": [{"index": 0, "delta": {"content": "Hi"}}]},
        {"id": "chatcmpl-x", "choices": [{"index": 0, "delta": {"tool_calls": [
            {"index": 0, "id": "c1", "function": {"name": "f", "arguments": ""}}]}}]},
        {"id": "chatcmpl-x", "choices": [{"index": 0, "delta": {"tool_calls": [
            {"index": 0, "function": {"arguments": '{"a":'}}]}}]},
        {"id": "chatcmpl-x", "choices": [{"index": 0, "delta": {"tool_calls": [
            {"index": 0, "function": {"arguments": "1}"}}]}}]},
        {"id": "chatcmpl-x", "choices": [{"index": 0, "finish_reason": "tool_calls", "delta": {}}],
         "timings": {"cache_n": 5, "prompt_n": 3, "predicted_n": 4}},
    ]  # fmt: skip
    out = events([event for chunk in chunks for event in translator.feed(chunk)])
    assert [name for name, _ in out] == [
        "message_start", "content_block_start", "content_block_delta", "content_block_stop",
        "content_block_start", "content_block_delta", "content_block_delta", "content_block_stop",
        "message_delta", "message_stop",
    ]  # fmt: skip
    partial = "".join(
        d["delta"]["partial_json"] for n, d in out if n == "content_block_delta" and d["index"] == 1
    )  # type: ignore[index]
    assert partial == '{"a":1}'
    assert out[-2][1]["usage"] == {"cache_read_input_tokens": 5, "input_tokens": 3, "output_tokens": 4}


def test_stream_error_becomes_an_anthropic_error_event() -> None:
    translator = StreamTranslator("m")
    translator.feed({"id": "x", "choices": [{"index": 0, "delta": {"content": "a"}}]})
    (name, data), *_ = events(translator.feed({"error": {"message": "boom", "type": "server_error"}})[-1:])
    assert name == "error"
    assert data == {"type": "error", "error": {"type": "api_error", "message": "boom"}}


def test_reasoning_becomes_thinking_blocks_in_order_and_unmerged() -> None:
    translator = StreamTranslator("m")
    pieces = ["First, ", "the slot; ", "then the answer."]
    chunks = [{"id": "x", "choices": [{"index": 0, "delta": {"reasoning_content": p}}]} for p in pieces]
    chunks += [
        {"id": "x", "choices": [{"index": 0, "delta": {"content": "Done."}}]},
        {
            "id": "x",
            "choices": [{"index": 0, "finish_reason": "stop", "delta": {}}],
            "timings": {"predicted_n": 9},
        },
    ]
    out = events([event for chunk in chunks for event in translator.feed(chunk)])
    thinking = [d["delta"]["thinking"] for n, d in out if n == "content_block_delta" and d["index"] == 0]  # type: ignore[index]
    assert thinking == pieces
    starts = [d["content_block"]["type"] for n, d in out if n == "content_block_start"]  # type: ignore[index]
    assert starts == ["thinking", "text"]
    message = to_message(
        {"choices": [{"finish_reason": "stop", "message": {"reasoning_content": "hmm", "content": "ok"}}]},
        "m",
    )
    assert [block["type"] for block in message["content"]] == ["thinking", "text"]
