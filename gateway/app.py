"""The HTTP app: ``create_app(settings)`` serves the routing core (``gateway.core.build_core``, the one
builder every front end uses) over the OpenAI and Anthropic APIs, with ``/health``, ``/metrics`` and
the admin dashboard. Handlers read the core (``app.state.core``); the inference endpoints go through
the relay (``app.state.relay``, ``gateway.relay``)."""

from __future__ import annotations

import asyncio
import secrets
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from importlib.resources import files
from pathlib import Path
from typing import Annotated, Any

import structlog
from litestar import Litestar, Request, Response, get, post
from litestar.exceptions import HTTPException
from litestar.params import PathParameter
from litestar.status_codes import HTTP_500_INTERNAL_SERVER_ERROR

from backends.clock import WALL, Clock
from gateway.admin.auth import AdminAuth
from gateway.admin.service import AdminService
from gateway.admin.views import admin_router
from gateway.api.document import openapi_config
from gateway.core import Core, fleet_rows, running_core
from gateway.errors import GatewayError, ModelNotFound, anthropic_error_body, openai_error_body
from gateway.key_limits.resilient import ResilientCounter
from gateway.metrics import CONTENT_TYPE as METRICS_CONTENT_TYPE
from gateway.middleware import request_context
from gateway.model_api import (
    anthropic_listing,
    anthropic_model,
    openai_listing,
    openai_model,
    speaks_anthropic,
)
from gateway.relay import Relay
from gateway.settings import Settings, is_loopback
from gateway.state.resilient import ResilientStore
from gateway.version import turnout_version
from policies import Endpoint

JSON = "application/json"


def _relay(request: Request[Any, Any, Any]) -> Relay:
    """The app's relay (from the request: a handler that asks for ``state`` has litestar build a
    ``State`` per request)."""
    relay: Relay = request.app.state.relay
    return relay


def _core(request: Request[Any, Any, Any]) -> Core:
    core: Core = request.app.state.core
    return core


@post("/v1/chat/completions", status_code=200)
async def chat_completions(request: Request[Any, Any, Any]) -> Response[Any]:
    return await _relay(request).handle(request, Endpoint.CHAT)


@post("/v1/completions", status_code=200)
async def completions(request: Request[Any, Any, Any]) -> Response[Any]:
    return await _relay(request).handle(request, Endpoint.COMPLETIONS)


@post("/v1/messages", status_code=200)
async def messages(request: Request[Any, Any, Any]) -> Response[Any]:
    """Anthropic Messages; x-api-key, anthropic-version, anthropic-beta and ?beta=true are accepted."""
    return await _relay(request).handle(request, Endpoint.MESSAGES)


@post("/v1/messages/count_tokens", status_code=200)
async def count_tokens(request: Request[Any, Any, Any]) -> Response[Any]:
    return await _relay(request).handle(request, Endpoint.COUNT_TOKENS)


@post("/v1/responses", status_code=200)
async def responses(request: Request[Any, Any, Any]) -> Response[Any]:
    return await _relay(request).handle(request, Endpoint.RESPONSES)


@get("/v1/models")
async def list_models(request: Request[Any, Any, Any]) -> Response[Any]:
    """Every model, in the shape of the API the client speaks (``anthropic-version``: Anthropic's)."""
    core = _core(request)
    key = core.access.authenticate(request.headers)
    catalog = core.catalog.visible(lambda name: core.access.allows(key, name))
    snapshots = core.fleet.snapshots()
    if speaks_anthropic(request.headers):
        body = anthropic_listing(catalog, snapshots, request.query_params)
    else:
        body = openai_listing(catalog, snapshots, request.query_params)
    return Response(body, media_type=JSON)


@get("/v1/models/{model_id:path}")
async def get_model(
    request: Request[Any, Any, Any], model_id: Annotated[Path, PathParameter()]
) -> Response[Any]:
    """One model by name or alias (names may hold slashes, as ``Qwen/Qwen3.5-27B`` does)."""
    core = _core(request)
    key = core.access.authenticate(request.headers)
    name = str(model_id).lstrip("/")
    model = core.catalog.resolve(name)
    if not core.access.allows(key, model.name):
        raise ModelNotFound(f"The model `{name}` does not exist or this key may not use it.", param="model")
    shape = anthropic_model if speaks_anthropic(request.headers) else openai_model
    return Response(shape(core.catalog, model, core.fleet.snapshots(), name), media_type=JSON)


@get("/metrics")
async def metrics(request: Request[Any, Any, Any]) -> Response[bytes]:
    """Prometheus metrics (docs/metrics.md): requests, TTFT, tokens, prediction error, fleet gauges."""
    core = _core(request)
    fleet = await fleet_rows(core)
    return Response(core.metrics.exposition(fleet), media_type=METRICS_CONTENT_TYPE)


@get("/favicon.ico", sync_to_thread=False, include_in_schema=False)
def favicon() -> Response[bytes]:
    """The dashboard's icon, where browsers look for it first (an SVG: every current browser takes one)."""
    body = files("gateway.admin").joinpath("static").joinpath("favicon.svg").read_bytes()
    return Response(body, media_type="image/svg+xml", headers={"cache-control": "max-age=86400"})


@get("/health")
async def health(request: Request[Any, Any, Any]) -> Response[Any]:
    """200 while at least one backend is ready (or not yet probed); 503 otherwise, and while the
    gateway drains before it exits (``draining``). ``warnings``: per backend, what its probe saw it
    do against routing's plan (a llama-server clearing idle slots), with the fix. ``residency``
    (with ``[[residency]]`` sets): per set, the member awake, the phase of a switch running, and the
    last switch (a failed one says why)."""
    core = _core(request)
    snapshots = core.fleet.snapshots()
    backends = {s.backend_id: s.health.value for s in snapshots}
    circuits = {s.backend_id: s.circuit for s in snapshots}
    warnings = {s.backend_id: list(s.warnings) for s in snapshots if s.warnings}
    ok = any(s.health.value in ("ready", "unknown") and not s.circuit_blocks for s in snapshots)
    store, counter = core.store, core.access.counter
    parts = (store, counter)  # Redis away: routing state and key limits both fall back to memory
    resilient = [part for part in parts if isinstance(part, ResilientStore | ResilientCounter)]
    for part in resilient:  # no traffic must not leave a recovered Redis reported away
        await part.retry()
    degraded = any(part.degraded for part in resilient)
    shared = "memory" if not isinstance(store, ResilientStore) else "degraded" if degraded else "ok"
    status = "draining" if _relay(request).draining else "ok" if ok else "unavailable"
    residency = {
        one["name"]: {
            "awake": one["awake"],
            "phase": one["phase"],
            "last_switch": one["history"][0] if one["history"] else None,
        }
        for one in core.residency.view()
    }
    body = {
        "status": status,
        "backends": backends,
        "circuits": circuits,
        "warnings": warnings,
        "state": shared,
    }
    return Response(
        body | ({"residency": residency} if residency else {}), status_code=200 if status == "ok" else 503
    )


def _is_anthropic(request: Request[Any, Any, Any]) -> bool:
    path = request.url.path
    return path.startswith("/v1/messages") or (
        path.startswith("/v1/models") and speaks_anthropic(request.headers)
    )


def _gateway_error(request: Request[Any, Any, Any], exc: GatewayError) -> Response[bytes]:
    body = exc.anthropic_body() if _is_anthropic(request) else exc.openai_body()
    return Response(body, status_code=exc.status, media_type=JSON, headers=exc.headers)


def _http_error(request: Request[Any, Any, Any], exc: HTTPException) -> Response[bytes]:
    if _is_anthropic(request):
        body = anthropic_error_body(exc.status_code, exc.detail)
    else:
        type_ = "not_found_error" if exc.status_code == 404 else "invalid_request_error"
        body = openai_error_body(exc.detail, type_)
    return Response(body, status_code=exc.status_code, media_type=JSON)


def _internal_error(request: Request[Any, Any, Any], exc: Exception) -> Response[bytes]:
    message = "The gateway failed to handle this request."
    body = (
        anthropic_error_body(500, message)
        if _is_anthropic(request)
        else openai_error_body(message, "server_error")
    )
    return Response(body, status_code=HTTP_500_INTERNAL_SERVER_ERROR, media_type=JSON)


def admin_token(settings: Settings) -> str:
    """The configured admin token, or (on loopback only: settings refuse otherwise) one made now and
    logged once, so the dashboard is never open to whoever can reach the port."""
    if settings.admin.token is not None:
        return settings.admin.token.get_secret_value()
    token = secrets.token_urlsafe(18)
    structlog.get_logger(__name__).warning(
        "admin.token_generated", token=token, note="no admin.token configured; log in to /admin with this"
    )
    return token


def create_app(settings: Settings, clock: Clock = WALL) -> Litestar:
    """Build the gateway for ``settings``; engines are probed when the app starts. ``clock``: what
    everything timed reads (``backends.clock``)."""
    if not settings.auth.all_keys() and not is_loopback(settings.host):
        structlog.get_logger(__name__).warning(
            "auth.open",
            host=settings.host,
            note="no auth.keys: anyone who reaches this port can use the engines",
        )

    @asynccontextmanager
    async def lifespan(app: Litestar) -> AsyncIterator[None]:
        async with running_core(settings, clock) as core:
            app.state.core = core
            app.state.relay = Relay(core)
            app.state.admin = AdminService(core, AdminAuth(admin_token(settings)))
            follow = asyncio.create_task(app.state.admin.follow_policy())
            try:
                yield
            finally:
                follow.cancel()

    return Litestar(
        route_handlers=[
            chat_completions,
            completions,
            messages,
            count_tokens,
            responses,
            list_models,
            get_model,
            health,
            metrics,
            favicon,
            *([admin_router] if settings.admin.enabled else []),
        ],
        lifespan=[lifespan],
        middleware=[request_context(settings.limits.max_header_bytes)],
        exception_handlers={
            GatewayError: _gateway_error,
            HTTPException: _http_error,
            Exception: _internal_error,
        },
        request_max_body_size=None,
        openapi_config=openapi_config(turnout_version()),  # /schema/openapi.json (gateway.api.document)
        logging_config=None,  # structlog is configured by the CLI; no stdlib handlers of litestar's
        debug=False,
    )
