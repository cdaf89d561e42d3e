"""The admin dashboard's HTTP handlers: server-rendered pages under ``/admin`` and their JSON under
``/admin/api/``. Pages render with Jinja2 (autoescaped); ``static/admin.js`` refreshes their live
parts from the JSON. Every handler but the login form and the static files needs an identity
(``gateway.admin.auth``); every action needs a CSRF token from a browser.
"""

from __future__ import annotations

import datetime as dt
from importlib.resources import files
from typing import Annotated, Any

import msgspec
from jinja2 import Environment, PackageLoader
from litestar import Request, Response, Router, get, post
from litestar.connection import ASGIConnection
from litestar.datastructures import State
from litestar.enums import RequestEncodingType
from litestar.exceptions import NotAuthorizedException
from litestar.handlers.base import BaseRouteHandler
from litestar.params import Body, PathParameter, QueryParameter
from litestar.response import Redirect

from gateway.admin import whatif
from gateway.admin.auth import COOKIE, Identity
from gateway.admin.service import DECISION_FILTERS, AdminError, AdminService, UnknownGroup
from gateway.api.service import AdminPin, AdminProfile, WhatIfEdits

HTML = "text/html; charset=utf-8"
JSON = "application/json"
SESSIONS_SHOWN = 200
PAGE_MIN_TURNS = 2
"""The sessions page hides one-turn sessions (one-off questions) unless asked: agents are the rows to see."""
STATIC = {
    "admin.js": "text/javascript; charset=utf-8",
    "admin.css": "text/css; charset=utf-8",
    "favicon.svg": "image/svg+xml",
}
SECURITY_HEADERS = {
    # no inline script can run, nothing loads from anywhere but the gateway itself
    "content-security-policy": "default-src 'self'; script-src 'self'; style-src 'self'; "
    "img-src 'self' data:; frame-ancestors 'none'; form-action 'self'; base-uri 'none'",
    "x-content-type-options": "nosniff",
    "referrer-policy": "no-referrer",
    "cache-control": "no-store",
}

Minutes = Annotated[int, QueryParameter(ge=1, le=24 * 60)]
"""A window of the decision log, in minutes (up to a day)."""
TimelineMinutes = Annotated[int, QueryParameter(ge=15, le=24 * 60)]
"""The slot timeline's window: 15 minutes to a day."""

templates = Environment(loader=PackageLoader("gateway.admin", "templates"), autoescape=True)
templates.filters["clock"] = lambda at: dt.datetime.fromtimestamp(at).strftime("%H:%M:%S")


def _service(state: State) -> AdminService:
    service: AdminService = state.admin
    return service


def _page(name: str, status: int = 200, **context: Any) -> Response[str]:
    return Response(templates.get_template(name).render(**context), media_type=HTML, status_code=status,
                    headers=SECURITY_HEADERS)  # fmt: skip


def _json(body: Any, status: int = 200) -> Response[bytes]:
    return Response(msgspec.json.encode(body), media_type=JSON, status_code=status, headers=SECURITY_HEADERS)


def _api_error(status: int, message: str) -> Response[bytes]:
    return _json({"error": {"message": message, "type": "admin_error"}}, status)


def _identity(request: Request[Any, Any, Any], state: State) -> Identity | None:
    return _service(state).auth.identify(request)


async def _render(
    request: Request[Any, Any, Any], state: State, name: str, page: str, **context: Any
) -> Response[Any]:
    identity = _identity(request, state)
    if identity is None:
        return Redirect("/admin/login")
    service = _service(state)
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
    auth = _service(state).auth
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
    identity = _identity(request, state)
    auth = _service(state).auth
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
    service = _service(state)
    data = await service.overview(with_bought=True)
    return await _render(request, state, "overview.html", "overview", data=data, bought=data.pop("bought"))


@get("/decisions", include_in_schema=False)
async def decisions_page(request: Request[Any, Any, Any], state: State) -> Response[Any]:
    values = {k: v for k, v in request.query_params.items() if k in DECISION_FILTERS}
    decisions = await _service(state).decisions(100, values)
    return await _render(request, state, "decisions.html", "decisions", decisions=decisions,
                         filters=DECISION_FILTERS, values=values)  # fmt: skip


@get("/decisions/{request_id:str}", include_in_schema=False)
async def decision_page(
    request: Request[Any, Any, Any], state: State, request_id: Annotated[str, PathParameter()]
) -> Response[Any]:
    if _identity(request, state) is None:  # before the lookup: a stranger learns nothing from a 404
        return Redirect("/admin/login")
    entry = await _service(state).decision(request_id)
    if entry is None:
        return _page("login.html", status=404, error=f"No decision {request_id} in the log.")
    return await _render(request, state, "decision.html", "decision", d=entry)


@get("/predictions", include_in_schema=False)
async def predictions_page(
    request: Request[Any, Any, Any],
    state: State,
    minutes: Minutes = 60,
) -> Response[Any]:
    data = await _service(state).predictions(minutes)
    return await _render(request, state, "predictions.html", "predictions", data=data)


@get("/slots", include_in_schema=False)
async def slots_page(
    request: Request[Any, Any, Any],
    state: State,
    minutes: TimelineMinutes = 60,
) -> Response[Any]:
    data = await _service(state).slots(minutes)
    return await _render(request, state, "slots.html", "slots", data=data)


@get("/whatif", include_in_schema=False)
async def whatif_page(request: Request[Any, Any, Any], state: State) -> Response[Any]:
    return await _render(request, state, "whatif.html", "whatif", form=_service(state).whatif_form())


@get("/sessions", include_in_schema=False)
async def sessions_page(
    request: Request[Any, Any, Any],
    state: State,
    q: Annotated[str, QueryParameter(max_length=256)] = "",
    min_turns: Annotated[int, QueryParameter(ge=0, le=1_000_000)] = PAGE_MIN_TURNS,
) -> Response[Any]:
    found = await _service(state).sessions(SESSIONS_SHOWN, query=q, min_turns=min_turns)
    return await _render(
        request, state, "sessions.html", "sessions", sessions=found, q=q, min_turns=min_turns
    )


@get("/sessions/{label:str}", include_in_schema=False)
async def session_page(
    request: Request[Any, Any, Any], state: State, label: Annotated[str, PathParameter()]
) -> Response[Any]:
    if _identity(request, state) is None:
        return Redirect("/admin/login")
    session = await _service(state).session(label)
    if session is None:
        return _page("login.html", status=404, error=f"No live session {label}.")
    return await _render(request, state, "session.html", "session", s=session)


@get("/policy", include_in_schema=False)
async def policy_page(request: Request[Any, Any, Any], state: State) -> Response[Any]:
    return await _render(request, state, "policy.html", "policy", p=_service(state).policy())


# JSON: the same data, for the pages' live parts and for scripts (Authorization: Bearer <token>).


@get("/overview")
async def api_overview(request: Request[Any, Any, Any], state: State) -> Response[bytes]:
    """Every backend: health, load, slots and who holds them, learned rates beside their priors, and
    requests per minute, TTFT p50/p90 and cache-hit ratio over the last 5 and 60 minutes."""
    return _json(await _service(state).overview())


@get("/decisions")
async def api_decisions(
    request: Request[Any, Any, Any],
    state: State,
    limit: Annotated[int, QueryParameter(ge=1, le=10_000)] = 100,
) -> Response[bytes]:
    """The newest routing decisions, newest first: every candidate's prediction and the outcome;
    ``model``, ``backend``, ``session`` and ``status`` filter them."""
    values = {k: v for k, v in request.query_params.items() if k in DECISION_FILTERS}
    return _json({"object": "list", "data": await _service(state).decisions(limit, values)})


@get("/decisions/{request_id:str}")
async def api_decision(
    request: Request[Any, Any, Any], state: State, request_id: Annotated[str, PathParameter()]
) -> Response[bytes]:
    entry = await _service(state).decision(request_id)
    return _json(entry) if entry is not None else _api_error(404, f"no decision {request_id} in the log")


@get("/policy")
async def api_policy(request: Request[Any, Any, Any], state: State) -> Response[bytes]:
    """The active profile, its filters and scorer weights, the profiles to switch to, which backends
    are drained, and every change made (who, from where, when)."""
    return _json(_service(state).policy())


def logged_in(connection: ASGIConnection[Any, Any, Any, Any], _: BaseRouteHandler) -> None:
    """The API's guard: a browser's session cookie or the admin token as a bearer token."""
    if connection.app.state.admin.auth.identify(connection) is None:
        raise NotAuthorizedException("log in at /admin/login, or send Authorization: Bearer <admin token>")


def _actor(request: Request[Any, Any, Any], state: State) -> Identity | Response[bytes]:
    identity = _identity(request, state)
    assert identity is not None  # the guard let it in
    if not _service(state).auth.csrf_ok(identity, request):
        return _api_error(403, "missing or wrong x-csrf-token")
    return identity


def _acting(
    request: Request[Any, Any, Any], state: State, action: str, actions: tuple[str, ...]
) -> Identity | Response[bytes]:
    """The admin taking one of ``actions`` (a path segment), or the refusal: 403 without the CSRF
    token, 404 naming the actions there are."""
    actor = _actor(request, state)
    if isinstance(actor, Response) or action in actions:
        return actor
    return _api_error(404, f"actions: {', '.join(actions)}")


@get("/series")
async def api_series(
    request: Request[Any, Any, Any],
    state: State,
    minutes: Minutes = 60,
) -> Response[bytes]:
    """For the charts: per backend, each request's predicted and actual TTFT ``[at, predicted,
    actual]``, and the cache-hit ratio per minute ``[minute, ratio]``."""
    return _json(await _service(state).series(minutes))


@get("/bought")
async def api_bought(request: Request[Any, Any, Any], state: State) -> Response[bytes]:
    """What routing bought over the last day: per backend, the TTFT the chosen backends saved against
    sending every request there (its predicted TTFT at decision time, corrected by its median actual /
    predicted, less the measured one), in total and per hour, and the requests only another backend
    could take."""
    return _json(await _service(state).bought())


@get("/predictions")
async def api_predictions(
    request: Request[Any, Any, Any],
    state: State,
    minutes: Minutes = 60,
) -> Response[bytes]:
    """Per backend over the last ``minutes``: actual / predicted TTFT (median, p90, per slice of the
    window), the scatter's points on log axes, and the learned rates beside their priors."""
    return _json(await _service(state).predictions(minutes))


@get("/slots")
async def api_slots(
    request: Request[Any, Any, Any],
    state: State,
    minutes: TimelineMinutes = 60,
) -> Response[bytes]:
    """The slot timeline over the last ``minutes`` (15 to 1,440): per llama.cpp backend one lane per
    slot, each answered request a bar (its session, colour, whether it evicted a session or restored
    from the RAM cache, x and width on a 960-wide axis), labelled with the session that held it last;
    per vLLM backend its running and waiting requests as the probes saw them."""
    return _json(await _service(state).slots(minutes))


@get("/whatif")
async def api_whatif_form(request: Request[Any, Any, Any], state: State) -> Response[bytes]:
    """What a what-if can replay: the recording, the backends as the replay simulates them (slots and
    windows as the engines reported them), the profiles."""
    return _json(_service(state).whatif_form())


@post("/whatif", status_code=200)
async def api_whatif(request: Request[Any, Any, Any], state: State) -> Response[bytes]:
    """Replay the recording's last ``minutes`` in virtual time under every profile and the oracle, on
    this gateway's fleet with the edits asked for (``remove``, ``copies``, ``slots``, ``windows``), by
    ``turnout replay`` in a child process; the report, with the command that made it. 409 while
    another runs."""
    actor = _actor(request, state)
    if isinstance(actor, Response):
        return actor
    try:
        edits = msgspec.json.decode(await request.body() or b"{}", type=WhatIfEdits)
    except (msgspec.DecodeError, msgspec.ValidationError, RecursionError) as exc:
        return _api_error(400, f"send {{minutes, model, remove, copies, slots, windows}}: {exc}")
    try:
        return _json(await _service(state).whatif(edits))
    except whatif.WhatIfError as exc:
        return _api_error(409 if isinstance(exc, whatif.Busy) else 400, str(exc))


@get("/sessions")
async def api_sessions(
    request: Request[Any, Any, Any],
    state: State,
    limit: Annotated[int, QueryParameter(ge=1, le=10_000)] = SESSIONS_SHOWN,
    q: Annotated[str, QueryParameter(max_length=256)] = "",
    min_turns: Annotated[int, QueryParameter(ge=0, le=1_000_000)] = 0,
) -> Response[bytes]:
    """Live sessions, most recent first: source, turns, backend and slot, tokens, time saved by reuse;
    ``q``: only those whose name or hash contains it, ``min_turns``: only those with as many turns
    (``hidden``: how many live sessions these filters left out)."""
    found = await _service(state).sessions(limit, query=q, min_turns=min_turns)
    return _json({"object": "list", **found})


@get("/sessions/{label:str}")
async def api_session(
    request: Request[Any, Any, Any], state: State, label: Annotated[str, PathParameter()]
) -> Response[bytes]:
    """One session and its timeline: every turn, and where a turn's prefix broke and what it cost."""
    session = await _service(state).session(label)
    return _json(session) if session is not None else _api_error(404, f"no live session {label}")


@post("/sessions/{label:str}/release", status_code=200)
async def api_release(
    request: Request[Any, Any, Any], state: State, label: Annotated[str, PathParameter()]
) -> Response[bytes]:
    """Drop the slot leases the session holds: its next turn is placed afresh."""
    actor = _actor(request, state)
    if isinstance(actor, Response):
        return actor
    try:
        released = await _service(state).release(label, actor)
    except AdminError as exc:
        return _api_error(404, str(exc))
    return _json({"released": [{"backend": b, "slot": s} for b, s in released]})


@get("/keys")
async def api_keys(request: Request[Any, Any, Any], state: State) -> Response[bytes]:
    """Per API key: its limits, requests and tokens in the last minute, running requests, and usage
    totals (requests that ended, their prompt, cached and completion tokens; since start, or with
    ``state.url`` kept in Redis for every replica). Names only, never keys."""
    return _json({"object": "list", "data": await _service(state).core.access.usage()})


@post("/policy/profile", status_code=200)
async def api_switch_profile(request: Request[Any, Any, Any], state: State) -> Response[bytes]:
    """Switch the routing profile for every new request: ``{"profile": "<name>"}``."""
    actor = _actor(request, state)
    if isinstance(actor, Response):
        return actor
    try:
        body = msgspec.json.decode(await request.body(), type=AdminProfile)
    except (msgspec.DecodeError, RecursionError):  # RecursionError: nested too deep for the decoder
        return _api_error(400, 'send {"profile": "<name>"}')
    try:
        await _service(state).switch_profile(body.profile, actor)
    except AdminError as exc:
        return _api_error(400, str(exc))
    return _json(_service(state).policy())


@post("/backends/{backend_id:str}/{action:str}", status_code=200)
async def api_drain(
    request: Request[Any, Any, Any],
    state: State,
    backend_id: Annotated[str, PathParameter()],
    action: Annotated[str, PathParameter()],
) -> Response[bytes]:
    """``drain``: no new requests go to the backend (those in flight finish); ``undrain``: back."""
    actor = _acting(request, state, action, ("drain", "undrain"))
    if isinstance(actor, Response):
        return actor
    try:
        await _service(state).drain(backend_id, action == "drain", actor)
    except AdminError as exc:
        return _api_error(404, str(exc))
    return _json(_service(state).policy())


@post("/groups/{group:str}/{action:str}", status_code=200)
async def api_pin(
    request: Request[Any, Any, Any],
    state: State,
    group: Annotated[str, PathParameter()],
    action: Annotated[str, PathParameter()],
) -> Response[bytes]:
    """``pin`` with ``{"member": "<model>"}``: the group's requests go to that member only (its
    conversations on another member move there); ``unpin``: each request chooses its member again."""
    actor = _acting(request, state, action, ("pin", "unpin"))
    if isinstance(actor, Response):
        return actor
    member = None
    if action == "pin":
        try:
            member = msgspec.json.decode(await request.body(), type=AdminPin).member
        except (msgspec.DecodeError, RecursionError):
            return _api_error(400, 'send {"member": "<model>"}')
    try:
        await _service(state).pin(group, member, actor)
    except AdminError as exc:
        return _api_error(404 if isinstance(exc, UnknownGroup) else 400, str(exc))
    return _json(_service(state).policy())


@post("/record/{action:str}", status_code=200)
async def api_record(
    request: Request[Any, Any, Any], state: State, action: Annotated[str, PathParameter()]
) -> Response[bytes]:
    """``start``: write each answered request to ``record.path`` as a replayable trace (this
    replica's own file); ``stop``: stop writing."""
    actor = _acting(request, state, action, ("start", "stop"))
    if isinstance(actor, Response):
        return actor
    try:
        _service(state).record(action == "start", actor)
    except AdminError as exc:
        return _api_error(400, str(exc))
    return _json(_service(state).policy())


api_router = Router(
    path="/api",
    guards=[logged_in],
    route_handlers=[
        api_overview, api_bought, api_decisions, api_decision, api_predictions, api_slots, api_sessions,
        api_session, api_release, api_series, api_whatif_form, api_whatif,
        api_keys, api_policy, api_switch_profile, api_drain, api_pin, api_record,
    ],
)  # fmt: skip
admin_router = Router(
    path="/admin",
    route_handlers=[
        login_form, login, logout, static, overview_page, decisions_page, decision_page, predictions_page,
        slots_page, whatif_page, sessions_page, session_page, policy_page, api_router,
    ],
)  # fmt: skip
