"""Composition root: build the Litestar app of one simulated engine (no side effects until startup)."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

from litestar import Litestar, Request, Response, get
from litestar.datastructures import State
from litestar.exceptions import MethodNotAllowedException, NotFoundException
from litestar.handlers import BaseRouteHandler

from backends.sim import llama_app, messages_app, responses_app, vllm_app
from backends.sim.config import SimConfig
from backends.sim.engine_base import BatchEngine
from backends.sim.engines import create_engine
from backends.sim.http_common import json_response
from backends.sim.llama_engine import LlamaEngine
from backends.sim.llama_slot_files import slot_action
from backends.sim.vllm_sleep import SLEEP_HANDLERS
from backends.sim.whatif import sim_whatif


@get("/_sim/events")
async def sim_events(request: Request[Any, Any, Any]) -> Response[bytes]:
    """Simulator-only: every :class:`SimEvent` so far, as a JSON list (for out-of-process tests)."""
    engine: BatchEngine = request.app.state.sim
    return json_response([e.to_json() for e in engine.events])


_LLAMA_HANDLERS: Sequence[BaseRouteHandler] = (
    llama_app.health, llama_app.props, llama_app.slots, llama_app.models, llama_app.metrics,
    llama_app.tokenize, llama_app.chat_input_tokens,
    llama_app.chat_completions, llama_app.completions,
    messages_app.messages, messages_app.count_tokens, responses_app.responses, responses_app.input_tokens,
)  # fmt: skip
_VLLM_HANDLERS: Sequence[BaseRouteHandler] = (
    vllm_app.health, vllm_app.version, vllm_app.load, vllm_app.models, vllm_app.metrics, vllm_app.tokenize,
    vllm_app.chat_completions, vllm_app.completions,
    messages_app.messages, messages_app.count_tokens, responses_app.responses,
)  # fmt: skip


def create_sim_app(config: SimConfig) -> Litestar:
    """A Litestar app serving the simulated ``config.kind`` engine; ``app.state.sim`` is the engine.

    The engine's step loop starts with the app (lifespan startup) and stops with it.
    """
    handlers: Sequence[BaseRouteHandler]
    engine = create_engine(config)
    if isinstance(engine, LlamaEngine):
        handlers, before, not_found = _LLAMA_HANDLERS, llama_app.before_request, llama_app.not_found
        handlers = (*handlers, slot_action)
    else:
        handlers, before, not_found = _VLLM_HANDLERS, vllm_app.before_request, vllm_app.not_found
        if config.enable_sleep_mode:
            handlers = (*handlers, *SLEEP_HANDLERS)
    exception_handlers: dict[
        int | type[Exception], Callable[[Request[Any, Any, Any], Any], Response[Any]]
    ] = {
        NotFoundException: not_found,
        MethodNotAllowedException: not_found,
    }
    return Litestar(
        route_handlers=[*handlers, sim_events, sim_whatif],
        before_request=before,
        exception_handlers=exception_handlers,
        on_startup=[engine.start],
        on_shutdown=[engine.stop],
        state=State({"sim": engine}),
        openapi_config=None,
        logging_config=None,
    )
