"""OpenAI's Responses API (``/v1/responses``) at the level the engines serve it: text and function
tools, ``instructions``, ``previous_response_id`` (only where the engine keeps responses: vLLM), and
streams of ``response.*`` events. Codex speaks it.
"""

from __future__ import annotations

from typing import Annotated, Any, Literal

from msgspec import Meta, Struct

Role = Literal["user", "assistant", "system", "developer"]


class InputText(Struct, tag_field="type", tag="input_text"):
    text: str


class OutputText(Struct, tag_field="type", tag="output_text"):
    text: str


class InputImage(Struct, tag_field="type", tag="input_image"):
    image_url: str
    detail: Literal["auto", "low", "high"] | None = None


class InputMessage(Struct, tag_field="type", tag="message"):
    role: Role
    content: str | list[InputText | OutputText | InputImage]


class FunctionCallItem(Struct, tag_field="type", tag="function_call"):
    call_id: str
    name: str
    arguments: Annotated[str, Meta(description="the arguments as a JSON text")]


class FunctionCallOutputItem(Struct, tag_field="type", tag="function_call_output"):
    call_id: str
    output: str


class SummaryText(Struct, tag_field="type", tag="summary_text"):
    text: str


class ReasoningItem(Struct, tag_field="type", tag="reasoning"):
    summary: list[SummaryText]
    encrypted_content: str | None = None


InputItem = InputMessage | FunctionCallItem | FunctionCallOutputItem | ReasoningItem


class FunctionTool(Struct, tag_field="type", tag="function"):
    name: str
    parameters: Annotated[dict[str, Any], Meta(description="a JSON Schema of the arguments")] | None = None
    description: str | None = None
    strict: bool | None = None


class Reasoning(Struct):
    effort: Literal["minimal", "low", "medium", "high"] | None = None
    summary: Literal["auto", "concise", "detailed"] | None = None


class ResponsesRequest(Struct):
    """``POST /v1/responses``. Routing reads ``model``, ``input`` (a string or an array of items),
    ``instructions``, ``max_output_tokens``, ``stream``, ``previous_response_id`` and the session
    keys (Codex's ``session-id`` header, ``prompt_cache_key``); the engine checks the rest."""

    model: str
    input: str | list[InputItem]
    instructions: str | None = None
    stream: bool | None = None
    max_output_tokens: Annotated[int, Meta(ge=0)] | None = None
    temperature: Annotated[float, Meta(ge=0, le=2)] | None = None
    top_p: Annotated[float, Meta(ge=0, le=1)] | None = None
    tools: list[FunctionTool] | None = None
    tool_choice: Literal["none", "auto", "required"] | None = None
    parallel_tool_calls: bool | None = None
    previous_response_id: (
        Annotated[str, Meta(description="only vLLM keeps responses: 400 where llama.cpp alone serves")] | None
    ) = None
    store: bool | None = None
    reasoning: Reasoning | None = None
    include: list[str] | None = None
    prompt_cache_key: str | None = None
    user: str | None = None
    metadata: dict[str, str] | None = None


class ResponsesInputTokensDetails(Struct):
    cached_tokens: int | None = None


class ResponsesUsage(Struct):
    input_tokens: Annotated[int, Meta(description="includes input_tokens_details.cached_tokens")]
    output_tokens: int
    total_tokens: int
    input_tokens_details: ResponsesInputTokensDetails | None = None


class OutputItem(Struct):
    """A message (``content`` of ``output_text`` parts), a ``function_call`` or a ``reasoning`` item."""

    type: str
    id: str | None = None
    role: str | None = None
    status: str | None = None
    content: list[dict[str, Any]] | None = None
    call_id: str | None = None
    name: str | None = None
    arguments: str | None = None


class Response(Struct):
    """A whole response; ``model`` is the name the client asked for."""

    id: str
    object: Literal["response"]
    created_at: int | float
    status: Annotated[str, Meta(description="completed, incomplete, failed, ...")]
    model: str
    output: list[OutputItem]
    usage: ResponsesUsage | None = None


class ResponseSnapshot(Struct):
    """The response as a ``response.*`` lifecycle event carries it; llama-server sends little more
    than ``id`` and ``status`` until the end."""

    id: str
    object: Literal["response"] | None = None
    status: str | None = None
    usage: ResponsesUsage | None = None
    error: dict[str, Any] | None = None


class ResponsesEvent(Struct):
    """One streamed event's data: ``response.created``, ``response.output_text.delta``, ...,
    ``response.completed`` (with ``response.usage``); turnout's own ``response.failed`` when an
    engine fails mid-stream."""

    type: Annotated[str, Meta(pattern="^(response|error)")]
    sequence_number: int | None = None
    response: ResponseSnapshot | None = None
