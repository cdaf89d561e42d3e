"""The engine models seen from this process, without HTTP: what a virtual-time replay's gateway reads.

:class:`EngineDocuments` answers a simulated engine's small endpoints (``backends.base.Documents``:
health, models, ``/props``, ``/slots``, ``/metrics``, the token counts) from the same renderers the
HTTP simulators serve them with (``llama_info``, ``vllm_info``), so the adapters' own probe code and
parsers turn them into snapshots. :func:`final_usage` is the usage the gateway parses off a finished
task's last streamed event (``llama_wire`` / ``vllm_wire`` through ``parse_usage``).

Counting a whole long prompt with the toy tokenizer costs milliseconds; a replay that knows its
prompts' token counts passes ``known`` (a body -> its count, or None) to skip it; any other body is
counted as the simulator would.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any

from backends.parsers.openai import parse_usage
from backends.sim import llama_info, llama_wire, tokenizer, vllm_info, vllm_wire
from backends.sim.chat import InvalidChat, render_chat
from backends.sim.engine_base import BatchEngine
from backends.sim.llama_engine import LlamaEngine
from backends.sim.requests import Endpoint, parse_request
from backends.sim.task import SimTask
from backends.sim.vllm_engine import VllmEngine
from policies.types import Usage

Known = Callable[[Mapping[str, Any]], int | None]
"""A replay's own token counts: the engine's count of a body it knows, None for any other."""


def nothing_known(body: Mapping[str, Any]) -> None:
    """:data:`Known` that knows nothing: every count is the simulator's own."""


def vllm_count(body: Mapping[str, Any]) -> int:
    """What the vLLM simulator's ``/tokenize`` counts: the rendered chat, or the ``prompt``."""
    messages = body.get("messages")
    if messages is not None:
        generation = body.get("add_generation_prompt", True) is not False
        return tokenizer.count(render_chat(messages, body.get("tools"), generation))
    prompt = body.get("prompt")
    if not isinstance(prompt, str):
        raise InvalidChat("'prompt' must be a string", "prompt")
    return tokenizer.count(prompt)


class EngineDocuments:
    """``backends.base.Documents`` of one simulated engine (module docstring)."""

    def __init__(self, engine: BatchEngine, known: Known = nothing_known) -> None:
        self.engine = engine
        self.known = known

    def __call__(self, path: str, payload: Mapping[str, Any] | None = None) -> tuple[int, Any]:
        try:
            if isinstance(self.engine, LlamaEngine):
                return self._llama(self.engine, path, payload)
            assert isinstance(self.engine, VllmEngine)
            return self._vllm(self.engine, path, payload)
        except InvalidChat as exc:
            return 400, {"error": {"message": str(exc), "type": "invalid_request_error", "code": 400}}

    def _llama(self, engine: LlamaEngine, path: str, payload: Mapping[str, Any] | None) -> tuple[int, Any]:
        if engine.is_loading:
            return 503, llama_wire.error_body("Loading model", "unavailable_error", 503)
        if payload is None:
            if path in ("/health", "/v1/health"):
                return 200, {"status": "ok"}
            if path == "/props":
                return 200, llama_info.props(engine)
            if path == "/slots":
                return 200, [llama_info.slot_json(s) for s in engine.slots]
            if path in ("/models", "/v1/models"):
                return 200, llama_info.models(engine)
            if path == "/metrics":
                return 200, llama_info.metrics_text(engine)
        elif path == "/v1/chat/completions/input_tokens":
            count = self.known(payload)
            if count is None:  # the app's own parsing: the same refusals
                count = len(parse_request(payload, Endpoint.CHAT, llama=True).prompt)
            return 200, {"input_tokens": count, "object": "response.input_tokens"}
        elif path == "/tokenize":
            content = payload.get("content")
            return 200, {"tokens": tokenizer.encode(content) if isinstance(content, str) else []}
        return 404, llama_wire.error_body("File Not Found", "not_found_error", 404)

    def _vllm(self, engine: VllmEngine, path: str, payload: Mapping[str, Any] | None) -> tuple[int, Any]:
        if payload is None:
            if path in ("/health", "/ping"):
                return 200, None
            if path == "/v1/models":
                return 200, vllm_info.models(engine)
            if path == "/metrics":
                return 200, vllm_info.metrics_text(engine)
        elif path == "/tokenize":
            count = self.known(payload)
            return 200, {
                "count": vllm_count(payload) if count is None else count,
                "max_model_len": engine.config.context_window,
                "tokens": None,
            }
        return 404, {"detail": "Not Found"}


def final_usage(engine: BatchEngine, task: SimTask) -> Usage | None:
    """The usage the gateway reads off ``task``'s last streamed event (chat, ``include_usage`` on):
    llama.cpp's usage chunk with ``timings``, vLLM's usage chunk."""
    if isinstance(engine, LlamaEngine):
        last = llama_wire.chat_final_chunks(task, task.id, engine.config.model, include_usage=True)[-1]
        return parse_usage(last)
    assert isinstance(engine, VllmEngine)
    details = engine.config.enable_prompt_tokens_details
    chunk = vllm_wire.usage_chunk(
        task,
        task.id,
        engine.config.model,
        0,
        details,
        chat=True,
        created_cache=engine.created_cache_tokens(task),
    )
    return parse_usage(chunk)
