"""The simulated llama-server HTTP API (Litestar handlers; engine logic lives in ``llama_engine``).

Checks run in the real server's order: loading (503 on every path) -> API key (401, ``/health`` exempt)
-> route (unknown: 404 ``File Not Found``). A generation request is queued first; the handler waits
for a slot to start it, so a queued *streaming* request has no status line or headers yet; errors
found when the slot starts it (context too long) come back as plain JSON errors.
"""

from __future__ import annotations

import secrets
from collections.abc import AsyncIterator
from typing import Any, cast

import msgspec
from litestar import Request, Response, get, post
from litestar.exceptions import HTTPException
from litestar.response import Stream

from backends.sim import llama_info, llama_wire, tokenizer
from backends.sim.chat import InvalidChat
from backends.sim.http_common import (
    SSE_HEADERS,
    collect,
    json_response,
    new_task,
    read_json,
    sse,
    unless_disconnected,
)
from backends.sim.llama_engine import LlamaEngine
from backends.sim.requests import Endpoint, parse_request
from backends.sim.task import SimTask, UpdateKind

AnyRequest = Request[Any, Any, Any]
HEALTH_PATHS = ("/health", "/v1/health")


def engine_of(request: AnyRequest) -> LlamaEngine:
    """The engine stored in ``app.state.sim``."""
    return cast(LlamaEngine, request.app.state.sim)


def _error(message: str, kind: str, code: int) -> Response[bytes]:
    return json_response(llama_wire.error_body(message, kind, code), code, "application/json; charset=utf-8")


def guard(request: AnyRequest) -> Response[bytes] | None:
    """503 while loading, then 401 for a wrong API key (``Authorization: Bearer`` or ``X-Api-Key``)."""
    engine = engine_of(request)
    if engine.is_loading:
        return _error("Loading model", "unavailable_error", 503)
    key = engine.config.api_key
    if key is None or request.url.path in HEALTH_PATHS:
        return None
    auth = request.headers.get("authorization", "")
    given = auth[7:] if auth.lower().startswith("bearer ") else request.headers.get("x-api-key", "")
    if not secrets.compare_digest(given, key):
        return _error("Invalid API Key", "authentication_error", 401)
    return None


async def before_request(request: AnyRequest) -> Response[bytes] | None:
    """Litestar hook running :func:`guard` on every routed request."""
    return guard(request)


def not_found(request: AnyRequest, exc: HTTPException) -> Response[bytes]:
    """Unknown path (or method): guard first, then 404 ``File Not Found``."""
    return guard(request) or _error("File Not Found", "not_found_error", 404)


@get(["/health", "/v1/health"], sync_to_thread=False)
def health() -> Response[bytes]:
    """200 ``{"status":"ok"}`` once loaded."""
    return json_response({"status": "ok"}, 200, "application/json; charset=utf-8")


@get("/props")
async def props(request: AnyRequest) -> Response[bytes]:
    """Server properties."""
    return json_response(llama_info.props(engine_of(request)))


@get("/slots")
async def slots(request: AnyRequest) -> Response[bytes]:
    """Per-slot state; ``?fail_on_no_slot=1`` gives 503 when no slot is idle."""
    engine = engine_of(request)
    if request.query_params.get("fail_on_no_slot") and all(s.busy for s in engine.slots):
        return _error("no slot available", "unavailable_error", 503)
    return json_response([llama_info.slot_json(s) for s in engine.slots])


@get(["/models", "/v1/models"])
async def models(request: AnyRequest) -> Response[bytes]:
    """The served model (alias) with per-slot ``meta.n_ctx``."""
    return json_response(llama_info.models(engine_of(request)))


@get("/metrics")
async def metrics(request: AnyRequest) -> Response[str]:
    """Prometheus text, ``llamacpp:`` names."""
    engine = engine_of(request)
    headers = {"Process-Start-Time-Unix": str(int(engine.process_start))}
    return Response(llama_info.metrics_text(engine), media_type="text/plain; version=0.0.4", headers=headers)


@post("/tokenize", status_code=200)
async def tokenize(request: AnyRequest) -> Response[bytes]:
    """``{"content": str}`` -> ``{"tokens": [ids]}`` (``with_pieces`` gives ``{id, piece}`` objects)."""
    try:
        body = await read_json(request)
    except msgspec.DecodeError as exc:
        return _error(f"[json.exception.parse_error.101] parse error: {exc}", "invalid_request_error", 400)
    content = body.get("content") if isinstance(body, dict) else None
    if not isinstance(content, str):
        return json_response({"tokens": []})
    if body.get("with_pieces"):
        pieces = tokenizer.pieces(content)
        return json_response({"tokens": [{"id": tokenizer.piece_id(p), "piece": p} for p in pieces]})
    return json_response({"tokens": tokenizer.encode(content)})


@post("/v1/chat/completions/input_tokens", status_code=200)
async def chat_input_tokens(request: AnyRequest) -> Response[bytes]:
    """A chat body -> ``{"input_tokens": N, "object": "response.input_tokens"}`` (no inference)."""
    try:
        body = await read_json(request)
        if not isinstance(body, dict):
            raise InvalidChat("request body must be a JSON object", "body")
        req = parse_request(body, Endpoint.CHAT, llama=True)
    except msgspec.DecodeError as exc:
        message = f"[json.exception.parse_error.101] parse error: syntax error while parsing value - {exc}"
        return _error(message, "invalid_request_error", 400)
    except InvalidChat as exc:
        return _error(str(exc), "invalid_request_error", 400)
    return json_response({"input_tokens": len(req.prompt), "object": "response.input_tokens"})


@post(["/v1/chat/completions", "/chat/completions"], status_code=200)
async def chat_completions(request: AnyRequest) -> Response[Any]:
    """OpenAI chat completions with llama.cpp extensions (``id_slot``, ``cache_prompt``, ``n_predict``)."""
    return await _generate(request, Endpoint.CHAT)


@post("/v1/completions", status_code=200)
async def completions(request: AnyRequest) -> Response[Any]:
    """OpenAI text completions."""
    return await _generate(request, Endpoint.COMPLETION)


async def _generate(request: AnyRequest, endpoint: Endpoint) -> Response[Any]:
    engine = engine_of(request)
    try:
        body = await read_json(request)
        if not isinstance(body, dict):
            raise InvalidChat("request body must be a JSON object", "body")
        req = parse_request(body, endpoint, llama=True)
    except msgspec.DecodeError as exc:
        message = f"[json.exception.parse_error.101] parse error: syntax error while parsing value - {exc}"
        return _error(message, "invalid_request_error", 400)
    except InvalidChat as exc:
        return _error(str(exc), "invalid_request_error", 400)
    engine.n_tasks += 1
    task = new_task(engine, req, engine.n_tasks, max(engine.config.context_window - len(req.prompt), 0))
    cmpl_id = ("chatcmpl-" if endpoint is Endpoint.CHAT else "cmpl-") + secrets.token_hex(16)
    engine.submit(task)
    stay, first = await unless_disconnected(request, task.outbox.get())
    if not stay or first is None:
        engine.cancel(task)
        return Response(b"", status_code=499)
    if first.kind is UpdateKind.ERROR and first.error is not None:
        return json_response(first.error.body, first.error.status, "application/json; charset=utf-8")
    model = engine.config.model
    if req.stream:
        stream = (
            _chat_stream(engine, task, cmpl_id, req.include_usage)
            if endpoint is Endpoint.CHAT
            else (_completion_stream(engine, task, cmpl_id))
        )
        return Stream(stream, media_type="text/event-stream", headers=SSE_HEADERS)
    stay, _last = await unless_disconnected(request, collect(task))
    if not stay:
        engine.cancel(task)
        return Response(b"", status_code=499)
    if endpoint is Endpoint.CHAT:
        return json_response(llama_wire.chat_response(task, cmpl_id, model))
    return json_response(llama_wire.completion_response(task, cmpl_id, model, stream=False))


async def _chat_stream(
    engine: LlamaEngine, task: SimTask, cmpl_id: str, include_usage: bool
) -> AsyncIterator[bytes]:
    """Chunks per token (a role chunk with the first), the final chunks, then ``[DONE]``."""
    model = engine.config.model
    first = True
    try:
        while True:
            update = await task.outbox.get()
            if update.kind is UpdateKind.TOKEN and update.token is not None:
                out = b""
                if first:
                    first = False
                    out += sse(llama_wire.chunk({"role": "assistant", "content": None}, None, cmpl_id, model))
                delta = llama_wire.token_delta(task, update.token)
                if delta is not None:
                    out += sse(llama_wire.chunk(delta, None, cmpl_id, model))
                if out:
                    yield out
            elif update.kind is UpdateKind.DONE:
                chunks = llama_wire.chat_final_chunks(task, cmpl_id, model, include_usage)
                yield b"".join(sse(c) for c in chunks) + llama_wire.SSE_DONE
                return
            elif update.kind is UpdateKind.ERROR and update.error is not None:
                yield sse({"error": update.error.body.get("error")})
                return
    finally:
        engine.cancel(task)


async def _completion_stream(engine: LlamaEngine, task: SimTask, cmpl_id: str) -> AsyncIterator[bytes]:
    """Text chunks per token, the final chunk (usage + timings), then ``[DONE]``."""
    model = engine.config.model
    try:
        while True:
            update = await task.outbox.get()
            if update.kind is UpdateKind.TOKEN and update.token is not None:
                if update.token.text:
                    yield sse(llama_wire.completion_chunk(update.token.text, cmpl_id, model))
            elif update.kind is UpdateKind.DONE:
                final = llama_wire.completion_response(task, cmpl_id, model, stream=True)
                yield sse(final) + llama_wire.SSE_DONE
                return
            elif update.kind is UpdateKind.ERROR and update.error is not None:
                yield sse({"error": update.error.body.get("error")})
                return
    finally:
        engine.cancel(task)
