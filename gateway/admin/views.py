"""The admin dashboard's HTTP handlers: server-rendered pages under ``/admin`` and their JSON under
``/admin/api/``. Pages render with Jinja2 (autoescaped); ``static/admin.js`` refreshes their live
parts from the JSON. Every handler but the login form and the static files needs an identity
(``gateway.admin.auth``); every action needs a CSRF token from a browser. The JSON handlers are in
``gateway.admin.api_views``, what both share in ``gateway.admin.responses``.
"""

from __future__ import annotations

import datetime as dt
from importlib.resources import files
from typing import Annotated, Any

from jinja2 import Environment, PackageLoader
from litestar import Request, Response, Router, get, post
from litestar.datastructures import State
from litestar.enums import RequestEncodingType
from litestar.params import Body, PathParameter, QueryParameter
from litestar.response import Redirect

from gateway.admin.api_views import api_router
from gateway.admin.auth import COOKIE
from gateway.admin.responses import (
    SECURITY_HEADERS,
    SESSIONS_SHOWN,
    Minutes,
    TimelineMinutes,
    identity_of,
    service_of,
)
from gateway.admin.service import DECISION_FILTERS

HTML = "text/html; charset=utf-8"
PAGE_MIN_TURNS = 2
"""The sessions page hides one-turn sessions (one-off questions) unless asked: agents are the rows to see."""
STATIC = {
    "admin.js": "text/javascript; charset=utf-8",
    "admin.css": "text/css; charset=utf-8",
    "favicon.svg": "image/svg+xml",
}

templates = Environment(loader=PackageLoader("gateway.admin", "templates"), autoescape=True)
templates.filters["clock"] = lambda at: dt.datetime.fromtimestamp(at).strftime("%H:%M:%S")


def _page(name: str, status: int = 200, **context: Any) -> Response[str]:
    return Response(templates.get_template(name).render(**context), media_type=HTML, status_code=status,
                    headers=SECURITY_HEADERS)  # fmt: skip


async def _render(
    request: Request[Any, Any, Any], state: State, name: str, page: str, **context: Any
) -> Response[Any]:
    identity = identity_of(request, state)
    if identity is None:
        return Redirect("/admin/login")
    service = service_of(state)
    csrf = service.auth.csrf_token(identity.nonce) if identity.nonce else ""
    return _page(name, page=page, who=identity.who, csrf=csrf, profile=service.core.router.profile.name,
                 title=page, **context)  # fmt: skip


@get("/login", sync_to_thread=False, include_in_schema=False)
def login_form() -> Response[str]:
    return _page("login.html")


@post("/login", status_code=303, include_in_schema=False)
async def login(
    state: State, data: Annotated[dict[str, str], Body(media_type=RequestEncodingType.URL_ENCODED)]
) -> Response[Any]:
    auth = service_of(state).auth
    if not auth.token_ok(data.get("token", "")):
        return _page("login.html", status=401, error="That is not the admin token.")
    response: Response[Any] = Redirect("/admin")
    response.set_cookie(COOKIE, auth.new_session(), path="/admin", httponly=True, samesite="strict",
                        secure=False, max_age=12 * 3600)  # fmt: skip
    return response


@post("/logout", status_code=303, include_in_schema=False)
async def logout(
    request: Request[Any, Any, Any],
    state: State,
    data: Annotated[dict[str, str], Body(media_type=RequestEncodingType.URL_ENCODED)],
) -> Response[Any]:
    identity = identity_of(request, state)
    auth = service_of(state).auth
    if identity is not None and identity.nonce and data.get("csrf") == auth.csrf_token(identity.nonce):
        response: Response[Any] = Redirect("/admin/login")
        response.delete_cookie(COOKIE, path="/admin")
        return response
    return Redirect("/admin")


@get("/static/{name:str}", sync_to_thread=False, include_in_schema=False)
def static(name: Annotated[str, PathParameter()]) -> Response[bytes]:
    if name not in STATIC:
        return Response(b"not found", status_code=404)
    body = files("gateway.admin").joinpath("static").joinpath(name).read_bytes()
    return Response(body, media_type=STATIC[name], headers={"x-content-type-options": "nosniff"})


@get("/", include_in_schema=False)
async def overview_page(request: Request[Any, Any, Any], state: State) -> Response[Any]:
    service = service_of(state)
    data = await service.overview(with_bought=True)
    return await _render(request, state, "overview.html", "overview", data=data, bought=data.pop("bought"))


@get("/decisions", include_in_schema=False)
async def decisions_page(request: Request[Any, Any, Any], state: State) -> Response[Any]:
    values = {k: v for k, v in request.query_params.items() if k in DECISION_FILTERS}
    decisions = await service_of(state).decisions(100, values)
    return await _render(request, state, "decisions.html", "decisions", decisions=decisions,
                         filters=DECISION_FILTERS, values=values)  # fmt: skip


@get("/decisions/{request_id:str}", include_in_schema=False)
async def decision_page(
    request: Request[Any, Any, Any], state: State, request_id: Annotated[str, PathParameter()]
) -> Response[Any]:
    if identity_of(request, state) is None:  # before the lookup: a stranger learns nothing from a 404
        return Redirect("/admin/login")
    entry = await service_of(state).decision(request_id)
    if entry is None:
        return _page("login.html", status=404, error=f"No decision {request_id} in the log.")
    return await _render(request, state, "decision.html", "decision", d=entry)


@get("/predictions", include_in_schema=False)
async def predictions_page(
    request: Request[Any, Any, Any],
    state: State,
    minutes: Minutes = 60,
) -> Response[Any]:
    data = await service_of(state).predictions(minutes)
    return await _render(request, state, "predictions.html", "predictions", data=data)


@get("/slots", include_in_schema=False)
async def slots_page(
    request: Request[Any, Any, Any],
    state: State,
    minutes: TimelineMinutes = 60,
) -> Response[Any]:
    data = await service_of(state).slots(minutes)
    return await _render(request, state, "slots.html", "slots", data=data)


@get("/whatif", include_in_schema=False)
async def whatif_page(request: Request[Any, Any, Any], state: State) -> Response[Any]:
    return await _render(request, state, "whatif.html", "whatif", form=service_of(state).whatif_form())


@get("/sessions", include_in_schema=False)
async def sessions_page(
    request: Request[Any, Any, Any],
    state: State,
    q: Annotated[str, QueryParameter(max_length=256)] = "",
    min_turns: Annotated[int, QueryParameter(ge=0, le=1_000_000)] = PAGE_MIN_TURNS,
) -> Response[Any]:
    found = await service_of(state).sessions(SESSIONS_SHOWN, query=q, min_turns=min_turns)
    return await _render(
        request, state, "sessions.html", "sessions", sessions=found, q=q, min_turns=min_turns
    )


@get("/sessions/{label:str}", include_in_schema=False)
async def session_page(
    request: Request[Any, Any, Any], state: State, label: Annotated[str, PathParameter()]
) -> Response[Any]:
    if identity_of(request, state) is None:
        return Redirect("/admin/login")
    session = await service_of(state).session(label)
    if session is None:
        return _page("login.html", status=404, error=f"No live session {label}.")
    return await _render(request, state, "session.html", "session", s=session)


@get("/policy", include_in_schema=False)
async def policy_page(request: Request[Any, Any, Any], state: State) -> Response[Any]:
    return await _render(request, state, "policy.html", "policy", p=service_of(state).policy())


admin_router = Router(
    path="/admin",
    route_handlers=[
        login_form, login, logout, static, overview_page, decisions_page, decision_page, predictions_page,
        slots_page, whatif_page, sessions_page, session_page, policy_page, api_router,
    ],
)  # fmt: skip
