"""OpenAI's chat completions and completions, as clients send them and engines answer them.

The request models follow OpenAI's reference at the level vLLM and llama-server implement it;
optional fields are nullable as OpenAI's are. The response models are what vLLM and llama-server
both send (llama-server adds ``timings``; vLLM adds its own nulls), so a response that validates
here validates for either engine.
"""

from __future__ import annotations

from typing import Annotated, Any, Literal

import msgspec
from msgspec import Meta, Struct

NonNegative = Annotated[int, Meta(ge=0)]
Penalty = Annotated[float, Meta(ge=-2, le=2)]


# --- request: messages -------------------------------------------------------------------------


class TextPart(Struct, tag_field="type", tag="text"):
    text: str


class ImageUrl(Struct):
    url: Annotated[str, Meta(description="an http(s) URL or a data: URL")]
    detail: Literal["auto", "low", "high"] | None = None


class ImagePart(Struct, tag_field="type", tag="image_url"):
    image_url: ImageUrl


class InputAudio(Struct):
    data: Annotated[str, Meta(description="base64")]
    format: Literal["wav", "mp3"]


class AudioPart(Struct, tag_field="type", tag="input_audio"):
    input_audio: InputAudio


ContentPart = TextPart | ImagePart | AudioPart


class FunctionCall(Struct):
    name: str
    arguments: Annotated[str, Meta(description="the arguments as a JSON text")]


class ToolCall(Struct):
    id: str
    function: FunctionCall
    type: Literal["function"] = "function"


class SystemMessage(Struct, tag_field="role", tag="system"):
    content: str | list[TextPart]
    name: str | None = None


class DeveloperMessage(Struct, tag_field="role", tag="developer"):
    content: str | list[TextPart]
    name: str | None = None


class UserMessage(Struct, tag_field="role", tag="user"):
    content: str | list[ContentPart]
    name: str | None = None


class AssistantMessage(Struct, tag_field="role", tag="assistant"):
    """An earlier answer. ``reasoning_content`` is the reasoning vLLM and llama-server return; sending
    it back keeps the engine's prompt cache valid on templates that render it."""

    content: str | list[TextPart] | None = None
    tool_calls: list[ToolCall] | None = None
    reasoning_content: str | None = None
    name: str | None = None


class ToolMessage(Struct, tag_field="role", tag="tool"):
    content: str | list[TextPart]
    tool_call_id: str


ChatMessage = SystemMessage | DeveloperMessage | UserMessage | AssistantMessage | ToolMessage


# --- request: tools and options ----------------------------------------------------------------


class FunctionDefinition(Struct):
    name: str
    description: str | None = None
    parameters: Annotated[dict[str, Any], Meta(description="a JSON Schema of the arguments")] | None = None
    strict: bool | None = None


class Tool(Struct):
    function: FunctionDefinition
    type: Literal["function"] = "function"


class NamedFunction(Struct):
    name: str


class NamedToolChoice(Struct):
    function: NamedFunction
    type: Literal["function"] = "function"


class StreamOptions(Struct):
    include_usage: Annotated[
        bool, Meta(description="a last chunk with `usage` (turnout asks vLLM for it either way)")
    ] = False


Stop = str | list[str]


class ChatCompletionRequest(Struct):
    """``POST /v1/chat/completions``. Routing reads ``model``, ``messages`` (a non-empty array of
    objects with a ``role``), the output limit, ``stream`` and the session keys; the engine checks
    the rest, and any other field is passed to it as sent."""

    model: Annotated[str, Meta(description="a model name or alias from GET /v1/models")]
    messages: Annotated[list[ChatMessage], Meta(min_length=1)]
    stream: bool | None = None
    stream_options: StreamOptions | None = None
    max_tokens: NonNegative | None = None
    max_completion_tokens: NonNegative | None = None
    temperature: Annotated[float, Meta(ge=0, le=2)] | None = None
    top_p: Annotated[float, Meta(ge=0, le=1)] | None = None
    n: Annotated[int, Meta(ge=1)] | None = None
    stop: Stop | None = None
    presence_penalty: Penalty | None = None
    frequency_penalty: Penalty | None = None
    seed: int | None = None
    tools: list[Tool] | None = None
    tool_choice: Literal["none", "auto", "required"] | NamedToolChoice | None = None
    parallel_tool_calls: bool | None = None
    response_format: dict[str, Any] | None = None
    logprobs: bool | None = None
    top_logprobs: Annotated[int, Meta(ge=0, le=20)] | None = None
    reasoning_effort: Literal["minimal", "low", "medium", "high"] | None = None
    user: Annotated[str, Meta(description="also a session key")] | None = None
    prompt_cache_key: Annotated[str, Meta(description="a session key (before `user`)")] | None = None
    metadata: dict[str, str] | None = None


class CompletionRequest(Struct):
    """``POST /v1/completions``: a text prompt (or prompts, or token ids)."""

    model: str
    prompt: Annotated[
        Any,  # msgspec allows one array type per union: the alternatives are spelled out
        Meta(
            description="a string, strings, token ids, or lists of token ids",
            extra_json_schema={
                "anyOf": [
                    {"type": "string"},
                    {"type": "array", "items": {"type": "string"}},
                    {"type": "array", "items": {"type": "integer", "minimum": 0}},
                    {"type": "array", "items": {"type": "array", "items": {"type": "integer", "minimum": 0}}},
                ]
            },
        ),
    ]
    stream: bool | None = None
    stream_options: StreamOptions | None = None
    max_tokens: NonNegative | None = None
    temperature: Annotated[float, Meta(ge=0, le=2)] | None = None
    top_p: Annotated[float, Meta(ge=0, le=1)] | None = None
    n: Annotated[int, Meta(ge=1)] | None = None
    stop: Stop | None = None
    echo: bool | None = None
    logprobs: Annotated[int, Meta(ge=0, le=5)] | None = None
    suffix: str | None = None
    seed: int | None = None
    user: str | None = None
    prompt_cache_key: str | None = None


# --- responses ---------------------------------------------------------------------------------


class PromptTokensDetails(Struct):
    cached_tokens: int | None = None


class Usage(Struct):
    prompt_tokens: int
    completion_tokens: int
    total_tokens: int
    prompt_tokens_details: PromptTokensDetails | None = None


class Timings(Struct):
    """llama-server's own accounting: ``prompt_n`` tokens computed, ``cache_n`` reused."""

    prompt_n: int | None = None
    cache_n: int | None = None
    prompt_ms: float | None = None
    predicted_n: int | None = None
    predicted_ms: float | None = None


class ReplyFunction(Struct):
    name: str | None = None
    arguments: str | None = None


class ReplyToolCall(Struct):
    function: ReplyFunction
    id: str | None = None
    type: str | None = None


class Reply(Struct):
    role: Literal["assistant"]
    content: str | None = None
    tool_calls: list[ReplyToolCall] | None = None
    reasoning_content: str | None = None


class ChatChoice(Struct):
    index: int
    message: Reply
    finish_reason: Annotated[str, Meta(description="stop, length, tool_calls, ...")] | None


class ChatCompletion(Struct):
    """A whole answer; ``model`` is the name the client asked for."""

    id: str
    object: Literal["chat.completion"]
    created: int
    model: str
    choices: list[ChatChoice]
    usage: Usage | None = None
    system_fingerprint: str | None = None
    timings: Timings | None = None


class ChunkFunction(Struct):
    name: str | None = None
    arguments: str | None = None


class ChunkToolCall(Struct):
    index: int
    id: str | None = None
    type: str | None = None
    function: ChunkFunction | None = None


class Delta(Struct):
    role: str | None = None
    content: str | None = None
    reasoning_content: str | None = None
    tool_calls: list[ChunkToolCall] | None = None


class ChunkChoice(Struct):
    index: int
    delta: Delta
    finish_reason: str | None = None


class ChatCompletionChunk(Struct):
    """One streamed event's data; the last may carry ``usage`` (and llama-server's ``timings``)
    with no choices."""

    id: str
    object: Literal["chat.completion.chunk"]
    created: int
    model: str
    choices: list[ChunkChoice]
    usage: Usage | None = None
    timings: Timings | None = None


class CompletionChoice(Struct):
    index: int
    text: str
    finish_reason: str | None = None


class Completion(Struct):
    """A text completion, whole or (streamed) one event's data."""

    id: str
    object: Literal["text_completion"]
    created: int
    model: str
    choices: list[CompletionChoice]
    usage: Usage | None = None
    timings: Timings | None = None


# --- errors ------------------------------------------------------------------------------------


class OpenAIErrorDetail(Struct):
    message: str
    type: Annotated[
        str,
        Meta(
            description="invalid_request_error, not_found_error, service_unavailable_error, upstream_error, "
            "rate_limit_error, ..."
        ),
    ]
    param: Annotated[str, Meta(description="the request field at fault")] | None
    code: (
        Annotated[
            str,
            Meta(
                description="model_not_found, context_length_exceeded, request_too_large, invalid_api_key, "
                "rate_limit_exceeded, no_backend_available, upstream_failed, ..."
            ),
        ]
        | None
    )


class OpenAIError(Struct):
    """OpenAI's error shape, on every path but ``/v1/messages*`` (and ``/v1/models`` for Anthropic
    clients)."""

    error: OpenAIErrorDetail


def error_body(message: str, type_: str, param: str | None = None, code: str | None = None) -> bytes:
    return msgspec.json.encode(OpenAIError(OpenAIErrorDetail(message, type_, param, code)))
