"""``POST /v1/responses`` on both simulators (OpenAI Responses API), and llama.cpp's
``/v1/responses/input_tokens``.

The body becomes a chat body (``convert.responses_to_chat``) and runs like a chat completion. llama.cpp
copies the body while converting, so ``id_slot``, ``cache_prompt`` and ``n_predict`` work here (unlike
``/v1/messages``); it rejects ``previous_response_id`` (400). vLLM (no response store by default)
answers ``previous_response_id`` with 404 ``Response with id '...' not found.``. The vLLM
response object (``ResponsesResponse.from_request``: the request echoed with the result) is built here.
"""

from __future__ import annotations

import time
from collections.abc import Mapping
from typing import Any, cast

from litestar import Request, Response, post

from backends.sim import responses_wire, vllm_wire
from backends.sim.chat import InvalidChat
from backends.sim.convert import responses_to_chat
from backends.sim.engine_base import BatchEngine
from backends.sim.http_common import json_response, sse
from backends.sim.messages_app import (
    created_cache,
    finish,
    is_llama,
    keep,
    launch,
    llama_error,
    read_body,
    sse_event,
    sse_events,
    stream,
    vllm_checks,
    vllm_error,
)
from backends.sim.requests import Endpoint, GenRequest, parse_request
from backends.sim.task import SimError, SimTask
from backends.sim.vllm_errors import summarize_input, validation_error

AnyRequest = Request[Any, Any, Any]
LLAMA_NO_PREVIOUS = "llama.cpp does not support 'previous_response_id'."


def _engine(request: AnyRequest) -> BatchEngine:
    return cast(BatchEngine, request.app.state.sim)


def _parse_llama(body: dict[str, Any]) -> GenRequest | Response[bytes]:
    previous = body.get("previous_response_id")
    try:
        if "input" in body and isinstance(previous, str) and previous:
            raise InvalidChat(LLAMA_NO_PREVIOUS, "previous_response_id")
        return parse_request(responses_to_chat(body), Endpoint.CHAT, llama=True)
    except InvalidChat as exc:
        return llama_error(str(exc))


def _validated(body: dict[str, Any]) -> dict[str, Any]:
    """The body as pydantic sees it after the request model's ``check_tool_usage`` (which sets
    ``tool_choice: none`` when there are no tools), for the ``<dict of N items>`` of its errors."""
    if not body.get("tools") and body.get("tool_choice", "auto") in ("auto", "none"):
        return body | {"tool_choice": "none"}
    return body


def _input_type_error(value: Any) -> Response[bytes]:
    """``input`` neither a string nor a list: pydantic reports both union members."""
    given = summarize_input(value)
    details = [
        {"type": kind, "loc": "body.input", "msg": f"Input should be a valid {what}", "input": given}
        for kind, what in (("string_type", "string"), ("list_type", "list"))
    ]
    message = "2 validation errors:\n" + "\n".join(f"  {detail}" for detail in details)
    return vllm_error(message, "Bad Request", 400, "body.input")


def _parse_vllm(engine: BatchEngine, body: dict[str, Any]) -> GenRequest | Response[bytes]:
    if "input" not in body:
        return validation_error("missing", ("body", "input"), "Field required", _validated(body))
    if not isinstance(body["input"], str | list):
        return _input_type_error(body["input"])
    try:
        chat = responses_to_chat(body)
        req = parse_request(chat, Endpoint.CHAT, llama=False)
    except InvalidChat as exc:
        return vllm_error(str(exc), "BadRequestError", 400, exc.param)
    previous = body.get("previous_response_id")
    if isinstance(previous, str):
        return vllm_error(
            f"Response with id '{previous}' not found.", "invalid_request_error", 404, "response_id"
        )
    return vllm_checks(engine, req, keep, chat, "max_output_tokens") or req


def _flat_tool(tool: Mapping[str, Any]) -> dict[str, Any]:
    return {
        "name": tool.get("name"), "parameters": tool.get("parameters"), "strict": tool.get("strict"),
        "type": "function", "allowed_callers": None, "async": None, "defer_loading": None,
        "description": tool.get("description"), "output_schema": None,
    }  # fmt: skip


def _float(value: Any) -> Any:
    """pydantic's ``float`` field: an integer becomes a float (``0`` -> ``0.0``); others stay."""
    return float(value) if isinstance(value, int) and not isinstance(value, bool) else value


def vllm_usage(task: SimTask, created: int) -> dict[str, Any]:
    """``ResponseUsage`` of a single-turn request (``SimpleContext`` keeps no per-turn metrics, so
    the ``..._per_turn`` lists are empty)."""
    n_prompt, n_out = len(task.prompt), task.n_emitted
    return {
        "input_tokens": n_prompt,
        "input_tokens_details": {
            "cached_tokens": task.cached, "cache_write_tokens": created,
            "input_tokens_per_turn": [], "cached_tokens_per_turn": [],
        },
        "output_tokens": n_out,
        "output_tokens_details": {
            "reasoning_tokens": 0, "tool_output_tokens": 0,
            "output_tokens_per_turn": [], "tool_output_tokens_per_turn": [],
        },
        "total_tokens": n_prompt + n_out,
    }  # fmt: skip


def vllm_response(
    body: Mapping[str, Any], resp_id: str, model: str, created_at: int, max_tokens: int,
    *, output: list[dict[str, Any]], status: str, usage: dict[str, Any] | None,
) -> dict[str, Any]:  # fmt: skip
    """``ResponsesResponse.from_request(...).model_dump()``: the request echoed with the result."""
    tools = [_flat_tool(t) for t in body.get("tools") or [] if isinstance(t, Mapping)]
    return {
        "id": resp_id, "created_at": created_at,
        "incomplete_details": {"reason": "max_output_tokens"} if status == "incomplete" else None,
        "instructions": body.get("instructions"), "metadata": body.get("metadata"), "model": model,
        "object": "response", "output": output, "parallel_tool_calls": body.get("parallel_tool_calls", True),
        "temperature": _float(body.get("temperature", 1.0)),
        "tool_choice": body.get("tool_choice", "auto" if tools else "none"),
        "tools": tools, "top_p": _float(body.get("top_p", 1.0)),
        "background": bool(body.get("background", False)),
        "max_output_tokens": max_tokens, "max_tool_calls": body.get("max_tool_calls"),
        "previous_response_id": None, "prompt": None, "reasoning": body.get("reasoning"),
        "service_tier": body.get("service_tier", "auto"), "status": status, "text": body.get("text"),
        "top_logprobs": None, "truncation": body.get("truncation", "disabled"), "usage": usage,
        "user": body.get("user"), "presence_penalty": 0.0, "frequency_penalty": 0.0,
        "kv_transfer_params": None, "ec_transfer_params": None,
        "input_messages": None, "output_messages": None,
    }  # fmt: skip


@post("/v1/responses/input_tokens", status_code=200)
async def input_tokens(request: AnyRequest) -> Response[bytes]:
    """llama.cpp: a Responses body -> ``{"input_tokens": N, "object": "response.input_tokens"}``."""
    body = await read_body(request)
    if isinstance(body, Response):
        return body
    req = _parse_llama(body)
    if isinstance(req, Response):
        return req
    return json_response({"input_tokens": len(req.prompt), "object": "response.input_tokens"})


@post(["/v1/responses"], status_code=200)
async def responses(request: AnyRequest) -> Response[Any]:
    """Create a response, streamed (``stream: true``) or not."""
    engine = _engine(request)
    body = await read_body(request)
    if isinstance(body, Response):
        return body
    if is_llama(engine):
        return await _llama(request, engine, body)
    return await _vllm(request, engine, body)


async def _llama(request: AnyRequest, engine: BatchEngine, body: dict[str, Any]) -> Response[Any]:
    req = _parse_llama(body)
    if isinstance(req, Response):
        return req
    started = await launch(request, engine, req)
    if isinstance(started, Response):
        return started
    task, model = started, engine.config.model
    resp_id = "resp_" + responses_wire.llama_random()
    if req.stream:
        events = responses_wire.LlamaResponseStream(task, resp_id, model)
        return stream(
            engine,
            task,
            lambda token: sse_events(events.token(token)),
            lambda: sse_events(events.done()),
            lambda error: sse({"error": error.body.get("error", error.body)}),
        )
    outcome = await finish(request, engine, task)
    if isinstance(outcome, Response):
        return outcome
    if outcome is not None:
        return json_response(outcome.body, outcome.status)
    return json_response(responses_wire.llama_response(task, resp_id, model))


async def _vllm(request: AnyRequest, engine: BatchEngine, body: dict[str, Any]) -> Response[Any]:
    req = _parse_vllm(engine, body)
    if isinstance(req, Response):
        return req
    max_tokens = (
        req.max_tokens if req.max_tokens is not None else engine.config.context_window - len(req.prompt)
    )
    started = await launch(request, engine, req)
    if isinstance(started, Response):
        return started
    task, model = started, engine.config.model
    resp_id, created_at = responses_wire.vllm_id("resp"), int(time.time())
    call_id = vllm_wire.tool_call_id(task)

    def response(output: list[dict[str, Any]], status: str, usage: dict[str, Any] | None) -> dict[str, Any]:
        return vllm_response(
            body, resp_id, model, created_at, max_tokens, output=output, status=status, usage=usage
        )

    def final() -> dict[str, Any]:
        status = "incomplete" if task.answer.finish_reason == "length" else "completed"
        return response([], status, vllm_usage(task, created_cache(engine, task)))

    if req.stream:
        events = responses_wire.VllmResponseStream(task, call_id)
        initial = response([], "in_progress", None)
        prologue = sse_events(
            [events.event("response.created", {"response": initial}),
             events.event("response.in_progress", {"response": initial})]
        )  # fmt: skip
        return stream(
            engine,
            task,
            lambda token: sse_events(events.token(token)),
            lambda: sse_events(events.done(final())),
            lambda error: _vllm_stream_error(events, error),
            prologue,
        )
    outcome = await finish(request, engine, task)
    if isinstance(outcome, Response):
        return outcome
    if outcome is not None:
        return json_response(outcome.body, outcome.status)
    return json_response(_with_output(final(), task, call_id))


def _with_output(response: dict[str, Any], task: SimTask, call_id: str) -> dict[str, Any]:
    response["output"] = responses_wire.vllm_output(task, call_id)
    return response


def _vllm_stream_error(events: responses_wire.VllmResponseStream, error: SimError) -> bytes:
    inner = error.body.get("error", {})
    message = inner.get("message", "") if isinstance(inner, dict) else str(inner)
    name, data = events.event("error", {"code": None, "message": message, "param": None})
    return sse_event(name, data)
