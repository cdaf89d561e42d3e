"""Anthropic Messages bodies and SSE events of both engines, key for key (pure: task in, dicts out).

llama.cpp (``server-task.cpp`` ``to_json_anthropic*``): usage is ``{cache_read_input_tokens = cache_n,
input_tokens = prompt - cache_n, output_tokens}``; ``message_start`` rides on the first generated token,
content blocks open on their first delta (a ``tool_use`` block without ``input``) and all close at the
end, then ``message_delta`` (usage ``{output_tokens}``) and ``message_stop``; no ``[DONE]``.

vLLM (``entrypoints/anthropic/serving.py``): the body is ``model_dump(exclude_none=True)`` (no
``stop_sequence``; an empty answer is one empty text block); usage splits the prompt into
``input_tokens``, ``cache_creation_input_tokens`` and ``cache_read_input_tokens`` (the latter two only
with ``--enable-prompt-tokens-details``); ``message_start`` carries ``{input_tokens, output_tokens: 0}``,
a block closes when the next opens or at the end, and ``tool_use`` blocks start with ``input: {}``.
"""

from __future__ import annotations

import json
from typing import Any

from backends.sim.generation import DeltaKind, OutToken
from backends.sim.task import SimTask

Event = tuple[str, dict[str, Any]]
STOP_REASONS = {"length": "max_tokens", "tool_calls": "tool_use"}


def stop_reason(task: SimTask) -> str:
    """``end_turn`` / ``max_tokens`` / ``tool_use`` from the answer's finish reason."""
    return STOP_REASONS.get(task.answer.finish_reason, "end_turn")


def error_body(kind: str, message: str) -> dict[str, Any]:
    """vLLM's ``AnthropicErrorResponse``."""
    return {"type": "error", "error": {"type": kind, "message": message}}


def _input(arguments: str) -> Any:
    try:
        value = json.loads(arguments)
    except ValueError:
        return {}
    return value if isinstance(value, dict) else {}


def llama_usage(task: SimTask) -> dict[str, int]:
    """``cache_read_input_tokens``, ``input_tokens`` (uncached part) and ``output_tokens``."""
    return {
        "cache_read_input_tokens": task.cached,
        "input_tokens": len(task.prompt) - task.cached,
        "output_tokens": task.n_emitted,
    }


def vllm_usage(task: SimTask, details: bool, created: int) -> dict[str, int]:
    """``_build_anthropic_usage`` of the final usage (cache fields only with prompt-token details)."""
    if not details:
        return {"input_tokens": len(task.prompt), "output_tokens": task.n_emitted}
    return {
        "input_tokens": max(0, len(task.prompt) - task.cached - created),
        "output_tokens": task.n_emitted,
        "cache_creation_input_tokens": created,
        "cache_read_input_tokens": task.cached,
    }


def message_body(
    task: SimTask, msg_id: str, model: str, *, call_id: str | None, usage: dict[str, int]
) -> dict[str, Any]:
    """The non-streamed message; ``call_id`` is None for llama.cpp (ids are the call's key) and
    the ``chatcmpl-tool-`` id for vLLM, whose body also drops ``stop_sequence``."""
    content: list[dict[str, Any]] = []
    if task.answer.text:
        content.append({"type": "text", "text": task.answer.text})
    call = task.answer.tool_call
    if call is not None:
        block_id = call.key if call_id is None else call_id
        content.append(
            {"type": "tool_use", "id": block_id, "name": call.name, "input": _input(task.answer.arguments)}
        )
    body: dict[str, Any] = {"id": msg_id, "type": "message", "role": "assistant", "content": content}
    body |= {"model": model, "stop_reason": stop_reason(task), "stop_sequence": None, "usage": usage}
    if call_id is not None:
        del body["stop_sequence"]
        if not content:
            content.append({"type": "text", "text": ""})
    return body


def _start_message(msg_id: str, model: str, usage: dict[str, int]) -> Event:
    message: dict[str, Any] = {"id": msg_id, "type": "message", "role": "assistant", "content": []}
    message["model"] = model
    message |= {"stop_reason": None, "stop_sequence": None, "usage": usage}
    return "message_start", {"type": "message_start", "message": message}


class LlamaMessageStream:
    """``to_json_anthropic`` of each partial result and ``to_json_anthropic_stream`` of the final one."""

    def __init__(self, task: SimTask, msg_id: str, model: str) -> None:
        self.task, self.msg_id, self.model = task, msg_id, model
        self.n_decoded = 0
        self.text_started = False

    def token(self, token: OutToken) -> list[Event]:
        """The events of one generated token."""
        self.n_decoded += 1
        events: list[Event] = []
        if self.n_decoded == 1:
            usage = llama_usage(self.task) | {"output_tokens": 0}
            events.append(_start_message(self.msg_id, self.model, usage))
        call = self.task.answer.tool_call
        tool_index = 1 if self.text_started else 0
        if token.kind is DeltaKind.TEXT and token.text:
            if not self.text_started:
                self.text_started = True
                block = {"type": "text", "text": ""}
                events.append(
                    (
                        "content_block_start",
                        {"type": "content_block_start", "index": 0, "content_block": block},
                    )
                )
            delta = {"type": "text_delta", "text": token.text}
            events.append(
                ("content_block_delta", {"type": "content_block_delta", "index": 0, "delta": delta})
            )
        elif token.kind is DeltaKind.TOOL_START and call is not None:
            block = {"type": "tool_use", "id": call.key, "name": call.name}
            events.append(
                (
                    "content_block_start",
                    {"type": "content_block_start", "index": tool_index, "content_block": block},
                )
            )
        elif token.kind is DeltaKind.TOOL_ARGS and token.text:
            delta = {"type": "input_json_delta", "partial_json": token.text}
            events.append(
                ("content_block_delta", {"type": "content_block_delta", "index": tool_index, "delta": delta})
            )
        return events

    def done(self) -> list[Event]:
        """Block stops, ``message_delta`` and ``message_stop``."""
        has_text = bool(self.task.answer.text)
        indexes = ([0] if has_text else []) + ([int(has_text)] if self.task.answer.tool_call else [])
        events: list[Event] = [
            ("content_block_stop", {"type": "content_block_stop", "index": i}) for i in indexes
        ]
        delta = {"stop_reason": stop_reason(self.task), "stop_sequence": None}
        usage = {"output_tokens": self.task.n_emitted}
        events.append(("message_delta", {"type": "message_delta", "delta": delta, "usage": usage}))
        events.append(("message_stop", {"type": "message_stop"}))
        return events


class VllmMessageStream:
    """``message_stream_converter`` over the chat stream (one block open at a time)."""

    def __init__(self, task: SimTask, msg_id: str, model: str, call_id: str) -> None:
        self.task, self.msg_id, self.model, self.call_id = task, msg_id, model, call_id
        self.started = False
        self.index = 0
        self.open: str | None = None

    def _close(self) -> list[Event]:
        if self.open is None:
            return []
        self.open = None
        self.index += 1
        return [("content_block_stop", {"type": "content_block_stop", "index": self.index - 1})]

    def _block(self, kind: str, block: dict[str, Any]) -> list[Event]:
        events = self._close() if self.open != kind else []
        if self.open != kind:
            self.open = kind
            events.append(
                (
                    "content_block_start",
                    {"type": "content_block_start", "content_block": block, "index": self.index},
                )
            )
        return events

    def token(self, token: OutToken) -> list[Event]:
        """``message_start`` (from the role chunk) and the events of one token's chat delta."""
        events: list[Event] = []
        if not self.started:
            self.started = True
            usage = {"input_tokens": len(self.task.prompt), "output_tokens": 0}
            events.append(_start_message(self.msg_id, self.model, usage))
        call = self.task.answer.tool_call
        if token.kind is DeltaKind.TEXT and token.text:
            events += self._block("text", {"type": "text", "text": ""})
            delta = {"type": "text_delta", "text": token.text}
            events.append(
                ("content_block_delta", {"type": "content_block_delta", "delta": delta, "index": self.index})
            )
        elif token.kind is DeltaKind.TOOL_START and call is not None:
            events += self._block(
                "tool_use", {"type": "tool_use", "id": self.call_id, "name": call.name, "input": {}}
            )
        elif token.kind is DeltaKind.TOOL_ARGS and token.text and self.open == "tool_use":
            delta = {"type": "input_json_delta", "partial_json": token.text}
            events.append(
                ("content_block_delta", {"type": "content_block_delta", "delta": delta, "index": self.index})
            )
        return events

    def done(self, usage: dict[str, int]) -> list[Event]:
        """Close the open block, then ``message_delta`` (final usage) and ``message_stop``."""
        events = self._close()
        delta = {"stop_reason": stop_reason(self.task), "stop_sequence": None}
        events.append(("message_delta", {"type": "message_delta", "delta": delta, "usage": usage}))
        events.append(("message_stop", {"type": "message_stop"}))
        return events
