"""Which event of a stream carries the engine's first token, for each API.

A stream's first bytes are not its first token. vLLM's ``/v1/responses`` sends ``response.created``
and ``response.in_progress`` as soon as it has the request, before it has prefilled a token of the
prompt, and Anthropic's ``/v1/messages`` opens with ``message_start``: taken as the first token,
these made a 75,890-token prompt's TTFT 0.05 s (the client saw its first token after 11.6 s), and
the prefill rate learned from it 30x too fast (issue #59). The first token is the first event that
carries output:

=====================  ========================================================================
API (its path's end)   an event that carries output
=====================  ========================================================================
``completions``        chat: a choice whose ``delta`` has ``content``, ``reasoning_content``,
                       ``reasoning``, ``refusal`` (a non-empty string) or ``tool_calls``;
                       text completions: a choice with non-empty ``text``
``messages``           ``content_block_delta`` (text, thinking, tool input); a
                       ``content_block_start`` of a ``tool_use`` block (its name is generated)
``responses``          any ``*.delta`` event (output text, reasoning, function-call arguments,
                       refusal); ``response.output_item.added`` of a ``function_call`` item
=====================  ========================================================================

An answer with no output at all (the engine's first token was its stop token) has its first token
where it says so: a choice's ``finish_reason``, ``message_delta``, ``response.completed`` or
``response.incomplete``. A stream that has neither has no first token (``None``: not learned from).
"""

from __future__ import annotations

from typing import Any

import msgspec

_CHAT_OUTPUT = ("content", "reasoning_content", "reasoning", "refusal")
_MESSAGES_FINISH = "message_delta"
_RESPONSES_FINISH = ("response.completed", "response.incomplete")


def event_json(event: bytes) -> Any:
    """The JSON of an SSE event's ``data:`` lines (None: none, ``[DONE]`` or not JSON)."""
    data = b"".join(line[5:].lstrip() for line in event.splitlines() if line.startswith(b"data:"))
    if not data or data == b"[DONE]":
        return None
    try:
        return msgspec.json.decode(data)
    except msgspec.DecodeError:
        return None


def _event_type(event: bytes, data: Any) -> str:
    """The SSE ``event:`` field, else the payload's ``type`` (both APIs send both; some relays drop
    the field)."""
    for line in event.splitlines():
        if line.startswith(b"event:"):
            return line[6:].strip().decode("utf-8", "replace")
    return str(data.get("type", "")) if isinstance(data, dict) else ""


def _chat(data: Any) -> tuple[bool, bool]:
    output = finish = False
    choices = data.get("choices") if isinstance(data, dict) else None
    for choice in choices if isinstance(choices, list) else ():
        if not isinstance(choice, dict):
            continue
        delta = choice.get("delta")
        if isinstance(delta, dict):
            output |= any(isinstance(delta.get(k), str) and delta[k] for k in _CHAT_OUTPUT)
            output |= bool(delta.get("tool_calls"))
        text = choice.get("text")
        output |= isinstance(text, str) and bool(text)
        finish |= choice.get("finish_reason") is not None
    return output, finish


def _messages(kind: str, data: Any) -> tuple[bool, bool]:
    if kind == "content_block_delta":
        return True, False
    if kind == "content_block_start" and isinstance(data, dict):
        block = data.get("content_block")
        return isinstance(block, dict) and block.get("type") == "tool_use", False
    return False, kind == _MESSAGES_FINISH


def _responses(kind: str, data: Any) -> tuple[bool, bool]:
    if kind.endswith(".delta"):
        return True, False
    if kind == "response.output_item.added" and isinstance(data, dict):
        item = data.get("item")
        return isinstance(item, dict) and item.get("type") == "function_call", False
    return False, kind in _RESPONSES_FINISH


def output_in(api: str, event: bytes) -> tuple[bool, bool]:
    """(carries output, says the answer ended) for one complete SSE event of ``api``'s stream."""
    data = event_json(event)
    if api == "messages":
        return _messages(_event_type(event, data), data)
    if api == "responses":
        return _responses(_event_type(event, data), data)
    return _chat(data)


class FirstToken:
    """Watches a stream's events until one carries output; the relay drops it then (it costs nothing
    after the first token)."""

    __slots__ = ("api",)

    def __init__(self, api: str) -> None:
        self.api = api

    def feed(self, events: list[bytes]) -> bool:
        """True when one of these complete events is the first to carry output (or the end of an
        answer that had none)."""
        return any(any(output_in(self.api, event)) for event in events)
