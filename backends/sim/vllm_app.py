"""The simulated vLLM OpenAI-compatible HTTP API (Litestar handlers; engine logic is in ``vllm_engine``).

Order of checks as in vLLM 0.32: API key on ``/v1...`` paths (401 ``{"error":"Unauthorized"}``) ->
body validation (400 ``Bad Request``) -> model name (404 ``NotFoundError``) -> context length
(400 ``BadRequestError``) -> queue. A streaming response sends its headers right away, before the
queue wait; in-stream errors are ``data: {"error":...}`` followed by ``data: [DONE]``.
"""

from __future__ import annotations

import secrets
import time
from collections.abc import AsyncIterator
from typing import Any, cast

import msgspec
from litestar import Request, Response, get, post
from litestar.exceptions import HTTPException
from litestar.response import Stream

from backends.sim import tokenizer, vllm_info, vllm_wire
from backends.sim.chat import InvalidChat, render_chat
from backends.sim.events import EventKind
from backends.sim.http_common import (
    SSE_HEADERS,
    collect,
    json_response,
    new_task,
    read_json,
    sse,
    unless_disconnected,
)
from backends.sim.requests import Endpoint, GenRequest, parse_request
from backends.sim.task import SimTask, UpdateKind
from backends.sim.vllm_engine import VllmEngine
from backends.sim.vllm_errors import context_error, json_error, validation_error, vllm_validation_error
from backends.sim.vllm_sleep import answers_while_asleep

AnyRequest = Request[Any, Any, Any]
AUTH_PREFIXES = ("/v1", "/v2", "/inference", "/cohere")


def engine_of(request: AnyRequest) -> VllmEngine:
    """The engine stored in ``app.state.sim``."""
    return cast(VllmEngine, request.app.state.sim)


def guard(request: AnyRequest) -> Response[bytes] | None:
    """``--api-key``: only ``/v1``-style paths need ``Authorization: Bearer <key>``."""
    key = engine_of(request).config.api_key
    if key is None or request.method == "OPTIONS" or not request.url.path.startswith(AUTH_PREFIXES):
        return None
    if not secrets.compare_digest(request.headers.get("authorization", ""), f"Bearer {key}"):
        return json_response({"error": "Unauthorized"}, 401)
    return None


GENERATION_PATHS = ("/v1/chat/completions", "/v1/completions", "/v1/messages", "/v1/responses")


async def before_request(request: AnyRequest) -> Response[bytes] | None:
    """Litestar hook running :func:`guard`; a generation request while asleep is answered 503
    (``backends.sim.vllm_sleep``)."""
    refused = guard(request)
    if refused is None and request.url.path in GENERATION_PATHS:
        return answers_while_asleep(engine_of(request))
    return refused


def not_found(request: AnyRequest, exc: HTTPException) -> Response[bytes]:
    """FastAPI-style ``{"detail": "Not Found"}`` (after the API-key check)."""
    if exc.status_code == 405:
        return guard(request) or json_response({"detail": "Method Not Allowed"}, 405)
    return guard(request) or json_response({"detail": "Not Found"}, 404)


@get(["/health", "/ping"], sync_to_thread=False)
def health() -> Response[bytes]:
    """200 with an empty body."""
    return Response(b"", status_code=200)


@get("/version", sync_to_thread=False)
def version() -> Response[bytes]:
    """``{"version": "0.32.0"}``."""
    return json_response({"version": vllm_wire.VERSION})


@get("/load", sync_to_thread=False)
def load() -> Response[bytes]:
    """``{"server_load": 0}`` (load tracking is off by default)."""
    return json_response({"server_load": 0})


@get("/v1/models")
async def models(request: AnyRequest) -> Response[bytes]:
    """The served model card."""
    return json_response(vllm_info.models(engine_of(request)))


@get("/metrics")
async def metrics(request: AnyRequest) -> Response[str]:
    """Prometheus text with ``vllm:`` names."""
    return Response(vllm_info.metrics_text(engine_of(request)), media_type="text/plain; version=1.0.0")


@post("/tokenize", status_code=200)
async def tokenize(request: AnyRequest) -> Response[bytes]:
    """``{prompt}`` or ``{messages}`` -> ``{"count", "max_model_len", "tokens", "token_strs": null}``."""
    engine = engine_of(request)
    try:
        body = await read_json(request)
        if not isinstance(body, dict):
            raise InvalidChat("Input should be a valid dictionary", "body")
        if "messages" in body:
            text = render_chat(
                body["messages"], body.get("tools"), body.get("add_generation_prompt", True) is not False
            )
        elif isinstance(body.get("prompt"), str):
            text = body["prompt"]
        else:
            raise InvalidChat("Field required", "body.prompt")
    except msgspec.DecodeError:
        return json_error(await request.body())
    except InvalidChat as exc:
        loc = tuple(exc.param.split(".")) if exc.param else ("body",)
        kind = "missing" if str(exc) == "Field required" else "value_error"
        return validation_error(kind, loc, str(exc), body if isinstance(body, dict) else {})
    tokens = tokenizer.encode(text)
    body_out = {
        "count": len(tokens),
        "max_model_len": engine.config.context_window,
        "tokens": tokens,
        "token_strs": None,
    }
    return json_response(body_out)


@post("/v1/chat/completions", status_code=200)
async def chat_completions(request: AnyRequest) -> Response[Any]:
    """OpenAI chat completions."""
    return await _generate(request, Endpoint.CHAT)


@post("/v1/completions", status_code=200)
async def completions(request: AnyRequest) -> Response[Any]:
    """OpenAI text completions."""
    return await _generate(request, Endpoint.COMPLETION)


async def _validate(
    request: AnyRequest, engine: VllmEngine, endpoint: Endpoint
) -> GenRequest | Response[bytes]:
    try:
        body = await read_json(request)
    except msgspec.DecodeError:
        return json_error(await request.body())
    if not isinstance(body, dict):
        message = "Input should be a valid dictionary or object to extract fields from"
        return validation_error("model_attributes_type", ("body",), message, body)
    field = "messages" if endpoint is Endpoint.CHAT else "prompt"
    if field not in body:
        return validation_error("missing", ("body", field), "Field required", body)
    if body.get("stream_options") and not body.get("stream"):
        message = "Stream options can only be defined when `stream=True`."
        return vllm_validation_error(message, "stream_options")
    try:
        req = parse_request(body, endpoint, llama=False)
    except InvalidChat as exc:
        return json_response(vllm_wire.error_body(str(exc), "BadRequestError", 400, exc.param), 400)
    if req.model is not None and req.model != engine.config.model:
        message = f"The model `{req.model}` does not exist. Valid aliases: {engine.config.model}."
        return json_response(vllm_wire.error_body(message, "NotFoundError", 404, "model"), 404)
    if req.max_tokens is not None and req.max_tokens < 1:
        message = f"max_tokens must be at least 1, got {req.max_tokens}."
        return vllm_validation_error(message, "max_tokens", req.max_tokens)
    error = context_error(
        len(req.prompt), req.max_tokens, engine.config.context_window, n_chars=_prompt_chars(body, endpoint)
    )
    if error is not None:
        engine.log.record(EventKind.REJECT, f"rejected-{secrets.token_hex(4)}", prompt_tokens=len(req.prompt))
        return error
    return req


def _prompt_chars(body: dict[str, Any], endpoint: Endpoint) -> int | None:
    """Length of the text the server tokenizes itself (rendered chat, text prompt); None for token ids."""
    if endpoint is Endpoint.CHAT:
        return len(render_chat(body["messages"], body.get("tools")))
    prompt = body.get("prompt")
    if isinstance(prompt, list) and len(prompt) == 1 and isinstance(prompt[0], str | list):
        prompt = prompt[0]
    return len(prompt) if isinstance(prompt, str) else None


async def _generate(request: AnyRequest, endpoint: Endpoint) -> Response[Any]:
    engine = engine_of(request)
    checked = await _validate(request, engine, endpoint)
    if isinstance(checked, Response):
        return checked
    req = checked
    engine.n_tasks += 1
    task = new_task(engine, req, engine.n_tasks, engine.config.context_window - len(req.prompt))
    req_id = ("chatcmpl-" if endpoint is Endpoint.CHAT else "cmpl-") + secrets.token_hex(
        8
    )  # vLLM 0.32: 16 hex digits
    created = int(time.time())
    engine.submit(task)
    if req.stream:
        if endpoint is Endpoint.CHAT:
            return Stream(
                _chat_stream(engine, task, req, req_id, created),
                media_type="text/event-stream",
                headers=SSE_HEADERS,
            )
        return Stream(
            _completion_stream(engine, task, req, req_id, created),
            media_type="text/event-stream",
            headers=SSE_HEADERS,
        )
    stay, _ = await unless_disconnected(request, collect(task))
    if not stay:
        engine.cancel(task)
        return Response(b"", status_code=499)
    details = engine.config.enable_prompt_tokens_details
    if endpoint is Endpoint.CHAT:
        return json_response(
            vllm_wire.chat_response(
                task,
                req_id,
                engine.config.model,
                created,
                details,
                req.named_tool,
                engine.created_cache_tokens(task),
            )
        )
    return json_response(vllm_wire.completion_response(task, req_id, engine.config.model, created, details))


def _final_delta(task: SimTask, index: int) -> dict[str, Any]:
    token = task.answer.tokens[index]
    delta = vllm_wire.token_delta(task, token)
    if delta is not None:
        return delta
    return {} if task.answer.tool_call is not None else {"content": token.text}


async def _chat_stream(
    engine: VllmEngine, task: SimTask, req: GenRequest, req_id: str, created: int
) -> AsyncIterator[bytes]:
    """Role chunk, one chunk per token with a delta, the finishing chunk, the usage chunk, ``[DONE]``."""
    model = engine.config.model
    seen = 0
    total = len(task.answer.tokens)
    try:
        while True:
            update = await task.outbox.get()
            if update.kind is UpdateKind.TOKEN and update.token is not None:
                out = sse(vllm_wire.role_chunk(req_id, model, created)) if seen == 0 else b""
                seen += 1
                if seen == total:
                    finish = vllm_wire.finish_reason(task, req.named_tool)
                    chunk = vllm_wire.token_chunk(
                        _final_delta(task, seen - 1), req_id, model, created, finish, not req.include_usage
                    )
                    out += sse(chunk)
                else:
                    delta = vllm_wire.token_delta(task, update.token)
                    if delta is not None:
                        out += sse(vllm_wire.token_chunk(delta, req_id, model, created, None, False))
                if out:
                    yield out
            elif update.kind is UpdateKind.DONE:
                details = engine.config.enable_prompt_tokens_details
                tail = (
                    sse(
                        vllm_wire.usage_chunk(
                            task,
                            req_id,
                            model,
                            created,
                            details,
                            chat=True,
                            created_cache=engine.created_cache_tokens(task),
                        )
                    )
                    if req.include_usage
                    else b""
                )
                yield tail + vllm_wire.SSE_DONE
                return
            elif update.kind is UpdateKind.ERROR and update.error is not None:
                yield sse(update.error.body) + vllm_wire.SSE_DONE
                return
    finally:
        engine.cancel(task)


async def _completion_stream(
    engine: VllmEngine, task: SimTask, req: GenRequest, req_id: str, created: int
) -> AsyncIterator[bytes]:
    """One ``text_completion`` chunk per token (the last with ``finish_reason``), usage chunk, ``[DONE]``."""
    model = engine.config.model
    seen = 0
    total = len(task.answer.tokens)
    try:
        while True:
            update = await task.outbox.get()
            if update.kind is UpdateKind.TOKEN and update.token is not None:
                seen += 1
                finish = task.answer.finish_reason if seen == total else None
                yield sse(
                    vllm_wire.completion_chunk(
                        update.token.text, req_id, model, created, finish, not req.include_usage
                    )
                )
            elif update.kind is UpdateKind.DONE:
                details = engine.config.enable_prompt_tokens_details
                tail = (
                    sse(vllm_wire.usage_chunk(task, req_id, model, created, details, chat=False))
                    if req.include_usage
                    else b""
                )
                yield tail + vllm_wire.SSE_DONE
                return
            elif update.kind is UpdateKind.ERROR and update.error is not None:
                yield sse(update.error.body) + vllm_wire.SSE_DONE
                return
    finally:
        engine.cancel(task)
