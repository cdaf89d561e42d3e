"""Anthropic Messages over an engine's chat completions, for llama-server's slot pinning.

llama-server's own ``/v1/messages`` rebuilds the request and drops ``id_slot`` and ``cache_prompt``
(tested on the real server), so a session could not be kept on its slot there. For a request that
must be pinned, the llama.cpp adapter sends the same conversation to ``/v1/chat/completions`` (which
honours ``id_slot``) in the form llama-server's own conversion produces, and these functions turn
the answer back into Anthropic's JSON and SSE:

- ``system`` (string or text blocks) -> a system message; text blocks -> text parts; ``tool_use`` ->
  ``tool_calls`` (compact JSON arguments); ``tool_result`` -> ``tool`` messages; ``tools`` ->
  functions (``input_schema`` -> ``parameters``); ``tool_choice`` any/tool -> required;
  ``stop_sequences`` -> ``stop``; ``temperature``/``top_p``/``top_k`` kept.
- The answer: reasoning (``reasoning_content``) -> a ``thinking`` block, content -> a ``text``
  block, each tool call -> a ``tool_use`` block;
  ``finish_reason`` stop/length/tool_calls -> ``stop_reason`` end_turn/max_tokens/tool_use; usage as
  llama-server reports it on ``/v1/messages`` (``input_tokens`` = prompt - cached,
  ``cache_read_input_tokens`` = cached).
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from typing import Any

import msgspec

STOP_REASONS = {"stop": "end_turn", "length": "max_tokens", "tool_calls": "tool_use"}
KEPT_FIELDS = ("temperature", "top_p", "top_k", "stream", "max_tokens")


def _text(content: object) -> str:
    if isinstance(content, str):
        return content
    if isinstance(content, list):
        return "".join(
            str(b.get("text", "")) for b in content if isinstance(b, Mapping) and b.get("type") == "text"
        )
    return ""


def _message(message: Mapping[str, Any]) -> list[dict[str, Any]]:
    content = message.get("content")
    if not isinstance(content, list):
        return [{"role": message.get("role"), "content": content if isinstance(content, str) else ""}]
    texts: list[dict[str, Any]] = []
    calls: list[dict[str, Any]] = []
    results: list[dict[str, Any]] = []
    for block in content:
        if not isinstance(block, Mapping):
            continue
        kind = block.get("type")
        if kind == "text" and isinstance(block.get("text"), str):
            texts.append({"type": "text", "text": block["text"]})
        elif kind == "tool_use":
            arguments = json.dumps(block.get("input") or {}, separators=(",", ":"), ensure_ascii=False)
            function = {"name": str(block.get("name") or ""), "arguments": arguments}
            calls.append({"id": str(block.get("id") or ""), "type": "function", "function": function})
        elif kind == "tool_result":
            results.append(
                {
                    "role": "tool",
                    "tool_call_id": block.get("tool_use_id"),
                    "content": _text(block.get("content")),
                }
            )
    out: list[dict[str, Any]] = []
    if texts or calls:
        converted: dict[str, Any] = {"role": message.get("role"), "content": texts or ""}
        if calls:
            converted["tool_calls"] = calls
        out.append(converted)
    return out + results


def to_chat(body: Mapping[str, Any]) -> dict[str, Any]:
    """The chat-completions body for an Anthropic Messages body (see the module docstring)."""
    messages: list[dict[str, Any]] = []
    if body.get("system") is not None:
        messages.append({"role": "system", "content": _text(body["system"])})
    for message in body.get("messages", []):
        if isinstance(message, Mapping):
            messages.extend(_message(message))
    chat: dict[str, Any] = {"messages": messages}
    chat.update({key: body[key] for key in KEPT_FIELDS if key in body})
    if isinstance(body.get("stop_sequences"), list):
        chat["stop"] = body["stop_sequences"]
    tools = body.get("tools")
    if isinstance(tools, list):
        chat["tools"] = [
            {
                "type": "function",
                "function": {
                    "name": str(t.get("name") or ""),
                    "description": str(t.get("description") or ""),
                    "parameters": t.get("input_schema") or {},
                },
            }
            for t in tools
            if isinstance(t, Mapping)
        ]
    choice = body.get("tool_choice")
    kind = choice.get("type") if isinstance(choice, Mapping) else None
    if kind in ("auto", "any", "tool"):
        chat["tool_choice"] = "auto" if kind == "auto" else "required"
    return chat


def _usage(data: Mapping[str, Any]) -> dict[str, int]:
    timings: Mapping[str, Any] = data["timings"] if isinstance(data.get("timings"), Mapping) else {}
    usage: Mapping[str, Any] = data["usage"] if isinstance(data.get("usage"), Mapping) else {}
    cached = int(timings.get("cache_n", 0))
    prompt = int(usage.get("prompt_tokens", cached + int(timings.get("prompt_n", 0))))
    output = int(usage.get("completion_tokens", timings.get("predicted_n", 0)))
    return {"cache_read_input_tokens": cached, "input_tokens": prompt - cached, "output_tokens": output}


def _input(arguments: str) -> Any:
    try:
        return json.loads(arguments) if arguments else {}
    except json.JSONDecodeError:
        return {}


def to_message(chat: Mapping[str, Any], model: str) -> dict[str, Any]:
    """An Anthropic message for a non-streamed chat completion."""
    choice = (chat.get("choices") or [{}])[0]
    message = choice.get("message") or {}
    content: list[dict[str, Any]] = []
    reasoning = message.get("reasoning_content") or message.get("reasoning")
    if reasoning:
        content.append({"type": "thinking", "thinking": reasoning, "signature": ""})
    if message.get("content"):
        content.append({"type": "text", "text": message["content"]})
    for call in message.get("tool_calls") or []:
        function = call.get("function") or {}
        content.append(
            {
                "type": "tool_use",
                "id": call.get("id"),
                "name": function.get("name"),
                "input": _input(function.get("arguments", "")),
            }
        )
    return {
        "id": "msg_" + str(chat.get("id", "")).removeprefix("chatcmpl-"),
        "type": "message",
        "role": "assistant",
        "content": content,
        "model": model,
        "stop_reason": STOP_REASONS.get(str(choice.get("finish_reason")), "end_turn"),
        "stop_sequence": None,
        "usage": _usage(chat),
    }


def _event(kind: str, data: Mapping[str, Any]) -> bytes:
    return b"event: " + kind.encode() + b"\ndata: " + msgspec.json.encode(data) + b"\n\n"


class StreamTranslator:
    """Chat-completion stream chunks in, Anthropic Messages events out (one instance per stream)."""

    def __init__(self, model: str) -> None:
        self.model = model
        self.started = False
        self.block: tuple[str, int] | None = None  # (kind, tool call index) of the open block
        self.index = -1
        self.finish: str | None = None

    def _open(self, kind: str, key: int, block: dict[str, Any]) -> list[bytes]:
        out = self._close()
        self.index += 1
        self.block = (kind, key)
        return [
            *out,
            _event(
                "content_block_start",
                {"type": "content_block_start", "index": self.index, "content_block": block},
            ),
        ]

    def _close(self) -> list[bytes]:
        if self.block is None:
            return []
        self.block = None
        return [_event("content_block_stop", {"type": "content_block_stop", "index": self.index})]

    def feed(self, chunk: Mapping[str, Any]) -> list[bytes]:
        """The Anthropic events for one chat chunk (``[DONE]`` is never passed in)."""
        out: list[bytes] = []
        error = chunk.get("error")
        if error is not None:
            text = error.get("message", "") if isinstance(error, Mapping) else str(error)
            body = {"type": "error", "error": {"type": "api_error", "message": text}}
            return [*self._close(), _event("error", body)]
        if not self.started:
            self.started = True
            message: dict[str, Any] = {
                "id": "msg_" + str(chunk.get("id", "")).removeprefix("chatcmpl-"), "type": "message",
                "role": "assistant", "content": [], "model": self.model, "stop_reason": None,
                "stop_sequence": None, "usage": {"input_tokens": 0, "output_tokens": 0},
            }  # fmt: skip
            out.append(_event("message_start", {"type": "message_start", "message": message}))
        for choice in chunk.get("choices") or []:
            delta = choice.get("delta") or {}
            reasoning = delta.get("reasoning_content") or delta.get("reasoning")
            if reasoning:
                if self.block is None or self.block[0] != "thinking":
                    out += self._open("thinking", 0, {"type": "thinking", "thinking": "", "signature": ""})
                thinking = {"type": "thinking_delta", "thinking": reasoning}
                out.append(
                    _event(
                        "content_block_delta",
                        {"type": "content_block_delta", "index": self.index, "delta": thinking},
                    )
                )
            if delta.get("content"):
                if self.block is None or self.block[0] != "text":
                    out += self._open("text", 0, {"type": "text", "text": ""})
                text = {"type": "text_delta", "text": delta["content"]}
                out.append(
                    _event(
                        "content_block_delta",
                        {"type": "content_block_delta", "index": self.index, "delta": text},
                    )
                )
            for call in delta.get("tool_calls") or []:
                function = call.get("function") or {}
                key = int(call.get("index", 0))
                if self.block != ("tool", key):
                    block = {
                        "type": "tool_use",
                        "id": call.get("id", ""),
                        "name": function.get("name", ""),
                        "input": {},
                    }
                    out += self._open("tool", key, block)
                if function.get("arguments"):
                    part = {"type": "input_json_delta", "partial_json": function["arguments"]}
                    out.append(
                        _event(
                            "content_block_delta",
                            {"type": "content_block_delta", "index": self.index, "delta": part},
                        )
                    )
            if choice.get("finish_reason"):
                self.finish = STOP_REASONS.get(choice["finish_reason"], "end_turn")
        if self.finish is not None and ("timings" in chunk or "usage" in chunk):
            out += self._close()
            delta = {"stop_reason": self.finish, "stop_sequence": None}
            out.append(
                _event("message_delta", {"type": "message_delta", "delta": delta, "usage": _usage(chunk)})
            )
            out.append(_event("message_stop", {"type": "message_stop"}))
            self.finish = None
        return out
