"""Anthropic's Messages API (``/v1/messages``, ``/v1/messages/count_tokens``) as Claude Code and the
anthropic SDKs send it, and as vLLM (or turnout's translation of llama-server's chat) answers it.

Anthropic's optional fields are absent rather than null, so they are ``UNSET`` here: the schema
lists them without allowing ``null``.
"""

from __future__ import annotations

from typing import Annotated, Any, Literal

import msgspec
from msgspec import UNSET, Meta, Struct, UnsetType

Positive = Annotated[int, Meta(ge=1)]


# --- request -----------------------------------------------------------------------------------


class CacheControl(Struct):
    type: Literal["ephemeral"] = "ephemeral"


class Text(Struct, tag_field="type", tag="text"):
    text: str
    cache_control: CacheControl | UnsetType = UNSET


class Base64Source(Struct, tag_field="type", tag="base64"):
    media_type: Literal["image/jpeg", "image/png", "image/gif", "image/webp"]
    data: str


class UrlSource(Struct, tag_field="type", tag="url"):
    url: str


class Image(Struct, tag_field="type", tag="image"):
    source: Base64Source | UrlSource
    cache_control: CacheControl | UnsetType = UNSET


class ToolUse(Struct, tag_field="type", tag="tool_use"):
    id: str
    name: str
    input: dict[str, Any]
    cache_control: CacheControl | UnsetType = UNSET


class ToolResult(Struct, tag_field="type", tag="tool_result"):
    tool_use_id: str
    content: str | list[Text | Image] | UnsetType = UNSET
    is_error: bool | UnsetType = UNSET
    cache_control: CacheControl | UnsetType = UNSET


class Thinking(Struct, tag_field="type", tag="thinking"):
    thinking: str
    signature: str


class RedactedThinking(Struct, tag_field="type", tag="redacted_thinking"):
    data: str


Block = Text | Image | ToolUse | ToolResult | Thinking | RedactedThinking


class Message(Struct):
    role: Literal["user", "assistant"]
    content: str | list[Block]


class ToolDefinition(Struct):
    name: str
    input_schema: Annotated[dict[str, Any], Meta(description="a JSON Schema of the input")]
    description: str | UnsetType = UNSET
    cache_control: CacheControl | UnsetType = UNSET


class AutoChoice(Struct, tag_field="type", tag="auto"):
    disable_parallel_tool_use: bool | UnsetType = UNSET


class AnyChoice(Struct, tag_field="type", tag="any"):
    disable_parallel_tool_use: bool | UnsetType = UNSET


class ToolChoice(Struct, tag_field="type", tag="tool"):
    name: str
    disable_parallel_tool_use: bool | UnsetType = UNSET


class NoChoice(Struct, tag_field="type", tag="none"):
    pass


class ThinkingEnabled(Struct, tag_field="type", tag="enabled"):
    budget_tokens: Annotated[int, Meta(ge=1024)]


class ThinkingDisabled(Struct, tag_field="type", tag="disabled"):
    pass


class Metadata(Struct):
    user_id: Annotated[str, Meta(description="a session key")] | None = None


class MessagesRequest(Struct):
    """``POST /v1/messages``. Routing reads ``model``, ``messages``, ``max_tokens`` (required, at
    least 1), ``stream``, ``system`` and the session keys (``x-claude-code-session-id``,
    ``metadata.user_id``); the engine checks the rest."""

    model: str
    messages: Annotated[list[Message], Meta(min_length=1)]
    max_tokens: Positive
    system: str | list[Text] | UnsetType = UNSET
    stream: bool | UnsetType = UNSET
    temperature: Annotated[float, Meta(ge=0, le=1)] | UnsetType = UNSET
    top_p: Annotated[float, Meta(ge=0, le=1)] | UnsetType = UNSET
    top_k: Annotated[int, Meta(ge=0)] | UnsetType = UNSET
    stop_sequences: list[str] | UnsetType = UNSET
    tools: list[ToolDefinition] | UnsetType = UNSET
    tool_choice: AutoChoice | AnyChoice | ToolChoice | NoChoice | UnsetType = UNSET
    thinking: ThinkingEnabled | ThinkingDisabled | UnsetType = UNSET
    metadata: Metadata | UnsetType = UNSET


class CountTokensRequest(Struct):
    """``POST /v1/messages/count_tokens``: the prompt of a Messages request, counted by the engine."""

    model: str
    messages: Annotated[list[Message], Meta(min_length=1)]
    system: str | list[Text] | UnsetType = UNSET
    tools: list[ToolDefinition] | UnsetType = UNSET
    tool_choice: AutoChoice | AnyChoice | ToolChoice | NoChoice | UnsetType = UNSET
    thinking: ThinkingEnabled | ThinkingDisabled | UnsetType = UNSET


# --- responses ---------------------------------------------------------------------------------


class MessagesUsage(Struct):
    input_tokens: Annotated[int, Meta(description="excludes cache_read_input_tokens")]
    output_tokens: int
    cache_creation_input_tokens: int | None = None
    cache_read_input_tokens: int | None = None


class OutText(Struct, tag_field="type", tag="text"):
    text: str


class OutToolUse(Struct, tag_field="type", tag="tool_use"):
    id: str
    name: str
    input: dict[str, Any]


class OutThinking(Struct, tag_field="type", tag="thinking"):
    thinking: str
    signature: str | None = None


OutBlock = OutText | OutToolUse | OutThinking | RedactedThinking


class MessageResponse(Struct):
    """A whole answer (and, with no content yet, ``message_start``'s message)."""

    id: str
    type: Literal["message"]
    role: Literal["assistant"]
    content: list[OutBlock]
    model: str
    stop_reason: Annotated[str, Meta(description="end_turn, max_tokens, stop_sequence, tool_use")] | None
    usage: MessagesUsage
    stop_sequence: str | None = None


class CountTokensResponse(Struct):
    input_tokens: int


class MessageStart(Struct, tag_field="type", tag="message_start"):
    message: MessageResponse


class BlockStart(Struct, tag_field="type", tag="content_block_start"):
    index: int
    content_block: OutBlock


class BlockDelta(Struct):
    type: Annotated[str, Meta(description="text_delta, input_json_delta, thinking_delta, signature_delta")]
    text: str | UnsetType = UNSET
    partial_json: str | UnsetType = UNSET
    thinking: str | UnsetType = UNSET
    signature: str | UnsetType = UNSET


class ContentBlockDelta(Struct, tag_field="type", tag="content_block_delta"):
    index: int
    delta: BlockDelta


class BlockStop(Struct, tag_field="type", tag="content_block_stop"):
    index: int


class StopDelta(Struct):
    stop_reason: str | None = None
    stop_sequence: str | None = None


class MessageDeltaUsage(Struct):
    output_tokens: int
    input_tokens: int | None = None
    cache_creation_input_tokens: int | None = None
    cache_read_input_tokens: int | None = None


class MessageDelta(Struct, tag_field="type", tag="message_delta"):
    delta: StopDelta
    usage: MessageDeltaUsage


class MessageStop(Struct, tag_field="type", tag="message_stop"):
    pass


class Ping(Struct, tag_field="type", tag="ping"):
    pass


# --- errors ------------------------------------------------------------------------------------

ErrorType = Literal[
    "invalid_request_error",
    "authentication_error",
    "permission_error",
    "not_found_error",
    "request_too_large",
    "rate_limit_error",
    "api_error",
    "overloaded_error",
]


class AnthropicErrorDetail(Struct):
    type: ErrorType
    message: str


class AnthropicError(Struct, tag_field="type", tag="error"):
    """Anthropic's error shape, on ``/v1/messages*`` and for Anthropic clients of ``/v1/models``; a
    stream that fails midway ends with it as an ``error`` event."""

    error: AnthropicErrorDetail


StreamEvent = (
    MessageStart
    | BlockStart
    | ContentBlockDelta
    | BlockStop
    | MessageDelta
    | MessageStop
    | Ping
    | AnthropicError
)

ERROR_TYPES: dict[int, ErrorType] = {
    400: "invalid_request_error",
    401: "authentication_error",
    403: "permission_error",
    404: "not_found_error",
    413: "request_too_large",
    429: "rate_limit_error",
    503: "overloaded_error",
    529: "overloaded_error",
}


def error_body(status: int, message: str) -> bytes:
    """The body of an error with ``status``: its Anthropic type, else by class (4xx, 5xx)."""
    error_type = ERROR_TYPES.get(status, "invalid_request_error" if status < 500 else "api_error")
    return msgspec.json.encode(AnthropicError(AnthropicErrorDetail(error_type, message)))
