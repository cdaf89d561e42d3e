"""``POST /v1/messages`` and ``/v1/messages/count_tokens`` on both simulators (Anthropic Messages API).

The body is converted to a chat body (``convert``) and runs on the engine like a chat completion, so
scheduling, slots, prefix reuse, cancellation on disconnect and usage are the engines' own. llama.cpp
drops ``id_slot``/``cache_prompt`` while converting, so a Messages request can never pin a slot.
Errors: llama.cpp answers in its usual ``{"error": {...}}`` shape (mid-stream: ``event: error``);
vLLM translates handler errors to ``{"type": "error", "error": {"type", "message"}}`` while body
validation errors keep its generic ``Bad Request`` shape. The run helpers here serve ``responses_app`` too.
"""

from __future__ import annotations

import secrets
from collections.abc import AsyncIterator, Callable, Iterable
from typing import Any, cast

import msgspec
from litestar import Request, Response, post
from litestar.response import Stream

from backends.sim import llama_wire, messages_wire, vllm_wire
from backends.sim.chat import InvalidChat, render_chat
from backends.sim.convert import ServerError, anthropic_to_chat
from backends.sim.engine_base import BatchEngine
from backends.sim.events import EventKind
from backends.sim.generation import OutToken
from backends.sim.http_common import (
    SSE_HEADERS,
    collect,
    json_response,
    new_task,
    read_json,
    unless_disconnected,
)
from backends.sim.llama_engine import LlamaEngine
from backends.sim.requests import Endpoint, GenRequest, parse_request
from backends.sim.task import SimError, SimTask, UpdateKind
from backends.sim.vllm_engine import VllmEngine
from backends.sim.vllm_errors import context_error, json_error, validation_error

AnyRequest = Request[Any, Any, Any]
ErrorWrap = Callable[[Response[bytes]], Response[bytes]]
_encoder = msgspec.json.Encoder()
_decoder = msgspec.json.Decoder()


def is_llama(engine: BatchEngine) -> bool:
    """Whether this is the llama.cpp simulator."""
    return engine.config.kind == "llamacpp"


def llama_error(message: str, kind: str = "invalid_request_error", code: int = 400) -> Response[bytes]:
    """llama-server's ``{"error": {"code", "message", "type"}}``."""
    return json_response(llama_wire.error_body(message, kind, code), code, "application/json; charset=utf-8")


def vllm_error(message: str, kind: str, code: int, param: str | None = None) -> Response[bytes]:
    """vLLM's ``ErrorResponse``."""
    return json_response(vllm_wire.error_body(message, kind, code, param), code)


def to_anthropic(response: Response[bytes]) -> Response[bytes]:
    """vLLM's ``translate_error_response``: keep the status, reshape the body."""
    error = _decoder.decode(response.content)["error"]
    body = messages_wire.error_body(error["type"], error["message"])
    return json_response(body, response.status_code or 400)


def keep(response: Response[bytes]) -> Response[bytes]:
    """No translation (the Responses API keeps vLLM's ``ErrorResponse``)."""
    return response


def sse_event(name: str, data: Any) -> bytes:
    """``event: <name>\\ndata: <json>\\n\\n``."""
    return b"event: " + name.encode() + b"\ndata: " + _encoder.encode(data) + b"\n\n"


def sse_events(events: Iterable[tuple[str, dict[str, Any]]]) -> bytes:
    """Several named events."""
    return b"".join(sse_event(name, data) for name, data in events)


async def read_body(request: AnyRequest) -> dict[str, Any] | Response[bytes]:
    """The JSON object body, or the engine's malformed-JSON error."""
    llama = is_llama(cast(BatchEngine, request.app.state.sim))
    try:
        body = await read_json(request)
    except msgspec.DecodeError as exc:
        if llama:
            return llama_error(
                f"[json.exception.parse_error.101] parse error: syntax error while parsing value - {exc}"
            )
        return json_error(await request.body())
    if not isinstance(body, dict):
        if llama:
            return llama_error("request body must be a JSON object")
        message = "Input should be a valid dictionary or object to extract fields from"
        return validation_error("model_attributes_type", ("body",), message, body)
    return body


def vllm_checks(
    engine: BatchEngine, req: GenRequest, wrap: ErrorWrap, chat: dict[str, Any], max_tokens_param: str
) -> Response[bytes] | None:
    """Model name (404) and context length (400), as the chat handler checks them; ``chat`` is the
    converted body (its rendered length is what vLLM measures), ``max_tokens_param`` how the
    endpoint's chat request names the output budget."""
    if req.model is not None and req.model != engine.config.model:
        message = f"The model `{req.model}` does not exist. Valid aliases: {engine.config.model}."
        return wrap(vllm_error(message, "NotFoundError", 404, "model"))
    n_chars = len(render_chat(chat["messages"], chat.get("tools")))
    window = engine.config.context_window
    error = context_error(
        len(req.prompt), req.max_tokens, window, n_chars=n_chars, max_tokens_param=max_tokens_param
    )
    if error is not None:
        engine.log.record(EventKind.REJECT, f"rejected-{secrets.token_hex(4)}", prompt_tokens=len(req.prompt))
        return wrap(error)
    return None


async def launch(request: AnyRequest, engine: BatchEngine, req: GenRequest) -> SimTask | Response[bytes]:
    """Submit ``req``. llama.cpp: wait until a slot starts it (a queued stream has no headers yet);
    the slot's first error comes back as plain JSON. vLLM: queue it and return at once."""
    engine.n_tasks += 1
    cap = max(engine.config.context_window - len(req.prompt), 0)
    task = new_task(engine, req, engine.n_tasks, cap)
    if isinstance(engine, VllmEngine):
        engine.submit(task)
        return task
    cast(LlamaEngine, engine).submit(task)
    stay, first = await unless_disconnected(request, task.outbox.get())
    if not stay or first is None:
        engine.cancel(task)
        return Response(b"", status_code=499)
    if first.kind is UpdateKind.ERROR and first.error is not None:
        return json_response(first.error.body, first.error.status, "application/json; charset=utf-8")
    return task


async def finish(
    request: AnyRequest, engine: BatchEngine, task: SimTask
) -> SimError | Response[bytes] | None:
    """Wait for a non-streamed task: None when done, its error, or 499 if the client left (cancelled)."""
    stay, last = await unless_disconnected(request, collect(task))
    if not stay:
        engine.cancel(task)
        return Response(b"", status_code=499)
    return last.error if last is not None and last.kind is UpdateKind.ERROR else None


def created_cache(engine: BatchEngine, task: SimTask) -> int:
    """vLLM ``created_cache_tokens`` (0 where the engine does not track it)."""
    method = getattr(engine, "created_cache_tokens", None)
    return int(method(task)) if callable(method) else 0


def stream(
    engine: BatchEngine,
    task: SimTask,
    on_token: Callable[[OutToken], bytes],
    on_done: Callable[[], bytes],
    on_error: Callable[[SimError], bytes],
    prologue: bytes = b"",
) -> Stream:
    """An SSE response driving ``task``; the task is cancelled if the client leaves."""

    async def body() -> AsyncIterator[bytes]:
        try:
            if prologue:
                yield prologue
            while True:
                update = await task.outbox.get()
                if update.kind is UpdateKind.TOKEN and update.token is not None:
                    out = on_token(update.token)
                    if out:
                        yield out
                elif update.kind is UpdateKind.DONE:
                    yield on_done()
                    return
                elif update.kind is UpdateKind.ERROR and update.error is not None:
                    yield on_error(update.error)
                    return
        finally:
            engine.cancel(task)

    return Stream(body(), media_type="text/event-stream", headers=SSE_HEADERS)


def _parse(
    engine: BatchEngine, body: dict[str, Any], count: bool
) -> tuple[dict[str, Any], GenRequest] | Response[bytes]:
    """The converted chat body and its request, or the engine's error."""
    llama = is_llama(engine)
    if not llama:
        for name in ("model", "messages") if count else ("model", "messages", "max_tokens"):
            if name not in body:
                return validation_error("missing", ("body", name), "Field required", body)
        max_tokens = body.get("max_tokens")
        if not count and isinstance(max_tokens, int) and not isinstance(max_tokens, bool) and max_tokens <= 0:
            error = ValueError("max_tokens must be positive")  # the request model's field validator
            return validation_error(
                "value_error", ("body", "max_tokens"), f"Value error, {error}", max_tokens, {"error": error}
            )
    try:
        chat = anthropic_to_chat(body, llama)
        return chat, parse_request(chat, Endpoint.CHAT, llama=llama)
    except ServerError as exc:
        return llama_error(str(exc), "server_error", 500)
    except InvalidChat as exc:
        if llama:
            return llama_error(str(exc))
        return to_anthropic(vllm_error(str(exc), "BadRequestError", 400, exc.param))


@post("/v1/messages/count_tokens", status_code=200)
async def count_tokens(request: AnyRequest) -> Response[bytes]:
    """``{"input_tokens": N}`` (vLLM adds ``context_management.original_input_tokens``)."""
    engine = cast(BatchEngine, request.app.state.sim)
    body = await read_body(request)
    if isinstance(body, Response):
        return body
    parsed = _parse(engine, body, count=True)
    if isinstance(parsed, Response):
        return parsed
    n = len(parsed[1].prompt)
    if is_llama(engine):
        return json_response({"input_tokens": n})
    return json_response({"input_tokens": n, "context_management": {"original_input_tokens": n}})


@post("/v1/messages", status_code=200)
async def messages(request: AnyRequest) -> Response[Any]:
    """Anthropic Messages, streamed (``stream: true``) or not."""
    engine = cast(BatchEngine, request.app.state.sim)
    body = await read_body(request)
    if isinstance(body, Response):
        return body
    parsed = _parse(engine, body, count=False)
    if isinstance(parsed, Response):
        return parsed
    chat, req = parsed
    llama = is_llama(engine)
    if not llama:
        rejected = vllm_checks(engine, req, to_anthropic, chat, "max_completion_tokens")
        if rejected is not None:
            return rejected
    started = await launch(request, engine, req)
    if isinstance(started, Response):
        return started
    task = started
    msg_id = "chatcmpl-" + (secrets.token_hex(8) if not llama else _llama_id())  # vLLM: 16 hex digits
    model = engine.config.model
    details = engine.config.enable_prompt_tokens_details
    call_id = None if llama else vllm_wire.tool_call_id(task)
    if req.stream:
        return _stream(engine, task, msg_id, model, call_id)
    outcome = await finish(request, engine, task)
    if isinstance(outcome, Response):
        return outcome
    if outcome is not None:
        return json_response(outcome.body, outcome.status)
    usage = (
        messages_wire.llama_usage(task)
        if llama
        else messages_wire.vllm_usage(task, details, created_cache(engine, task))
    )
    return json_response(messages_wire.message_body(task, msg_id, model, call_id=call_id, usage=usage))


def _llama_id() -> str:
    alphabet = "0123456789ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz"
    return "".join(secrets.choice(alphabet) for _ in range(32))


def _stream(engine: BatchEngine, task: SimTask, msg_id: str, model: str, call_id: str | None) -> Stream:
    if call_id is None:
        llama = messages_wire.LlamaMessageStream(task, msg_id, model)
        return stream(
            engine,
            task,
            lambda token: sse_events(llama.token(token)),
            lambda: sse_events(llama.done()),
            lambda error: sse_event("error", error.body.get("error", error.body)),
        )
    vllm = messages_wire.VllmMessageStream(task, msg_id, model, call_id)
    details = engine.config.enable_prompt_tokens_details

    def done() -> bytes:
        return sse_events(vllm.done(messages_wire.vllm_usage(task, details, created_cache(engine, task))))

    def error(err: SimError) -> bytes:
        inner = err.body.get("error", {})
        message = inner.get("message", "") if isinstance(inner, dict) else str(inner)
        return sse_event("error", {"type": "error", "error": {"type": "internal_error", "message": message}})

    return stream(engine, task, lambda token: sse_events(vllm.token(token)), done, error)
