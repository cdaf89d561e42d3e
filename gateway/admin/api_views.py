"""The admin dashboard's JSON under ``/admin/api/`` (``api_router``): the data the pages show, for
their live parts and for scripts (``Authorization: Bearer <token>``), and the admin's actions (switch
the profile, drain a backend, pin a group's member, switch a residency set's GPUs, release a
session's slots, start or stop recording, run a what-if), each behind a CSRF token from a browser.
The guard ``logged_in`` lets in a browser's session cookie or the admin token.
"""

from __future__ import annotations

from typing import Annotated, Any

import msgspec
from litestar import Request, Response, Router, get, post
from litestar.connection import ASGIConnection
from litestar.datastructures import State
from litestar.exceptions import NotAuthorizedException
from litestar.handlers.base import BaseRouteHandler
from litestar.params import PathParameter, QueryParameter

from gateway.admin import whatif
from gateway.admin.auth import Identity
from gateway.admin.responses import (
    SECURITY_HEADERS,
    SESSIONS_SHOWN,
    Minutes,
    TimelineMinutes,
    identity_of,
    service_of,
)
from gateway.admin.service import DECISION_FILTERS, AdminError, ResidencyBusy, UnknownGroup
from gateway.api.service import AdminPin, AdminProfile, AdminWake, WhatIfEdits
from gateway.disconnect import ClientDisconnected, DisconnectWatch

JSON = "application/json"


def _json(body: Any, status: int = 200) -> Response[bytes]:
    return Response(msgspec.json.encode(body), media_type=JSON, status_code=status, headers=SECURITY_HEADERS)


def _api_error(status: int, message: str) -> Response[bytes]:
    return _json({"error": {"message": message, "type": "admin_error"}}, status)


@get("/overview")
async def api_overview(request: Request[Any, Any, Any], state: State) -> Response[bytes]:
    """Every backend: health, load, slots and who holds them, learned rates beside their priors, and
    requests per minute, TTFT p50/p90 and cache-hit ratio over the last 5 and 60 minutes."""
    return _json(await service_of(state).overview())


@get("/decisions")
async def api_decisions(
    request: Request[Any, Any, Any],
    state: State,
    limit: Annotated[int, QueryParameter(ge=1, le=10_000)] = 100,
) -> Response[bytes]:
    """The newest routing decisions, newest first: every candidate's prediction and the outcome;
    ``model``, ``backend``, ``session`` and ``status`` filter them."""
    values = {k: v for k, v in request.query_params.items() if k in DECISION_FILTERS}
    return _json({"object": "list", "data": await service_of(state).decisions(limit, values)})


@get("/decisions/{request_id:str}")
async def api_decision(
    request: Request[Any, Any, Any], state: State, request_id: Annotated[str, PathParameter()]
) -> Response[bytes]:
    entry = await service_of(state).decision(request_id)
    return _json(entry) if entry is not None else _api_error(404, f"no decision {request_id} in the log")


@get("/policy")
async def api_policy(request: Request[Any, Any, Any], state: State) -> Response[bytes]:
    """The active profile, its filters and scorer weights, the profiles to switch to, which backends
    are drained, and every change made (who, from where, when)."""
    return _json(service_of(state).policy())


def logged_in(connection: ASGIConnection[Any, Any, Any, Any], _: BaseRouteHandler) -> None:
    """The API's guard: a browser's session cookie or the admin token as a bearer token."""
    if connection.app.state.admin.auth.identify(connection) is None:
        raise NotAuthorizedException("log in at /admin/login, or send Authorization: Bearer <admin token>")


def _actor(request: Request[Any, Any, Any], state: State) -> Identity | Response[bytes]:
    identity = identity_of(request, state)
    assert identity is not None  # the guard let it in
    if not service_of(state).auth.csrf_ok(identity, request):
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
    return _json(await service_of(state).series(minutes))


@get("/bought")
async def api_bought(request: Request[Any, Any, Any], state: State) -> Response[bytes]:
    """What routing bought over the last day: per backend, the TTFT the chosen backends saved against
    sending every request there (its predicted TTFT at decision time, corrected by its median actual /
    predicted, less the measured one), in total and per hour, and the requests only another backend
    could take."""
    return _json(await service_of(state).bought())


@get("/predictions")
async def api_predictions(
    request: Request[Any, Any, Any],
    state: State,
    minutes: Minutes = 60,
) -> Response[bytes]:
    """Per backend over the last ``minutes``: actual / predicted TTFT (median, p90, per slice of the
    window), the scatter's points on log axes, and the learned rates beside their priors."""
    return _json(await service_of(state).predictions(minutes))


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
    return _json(await service_of(state).slots(minutes))


@get("/whatif")
async def api_whatif_form(request: Request[Any, Any, Any], state: State) -> Response[bytes]:
    """What a what-if can replay: the recording, the backends as the replay simulates them (slots and
    windows as the engines reported them), the profiles."""
    return _json(service_of(state).whatif_form())


@post("/whatif", status_code=200)
async def api_whatif(request: Request[Any, Any, Any], state: State) -> Response[bytes]:
    """Replay the recording's last ``minutes`` in virtual time under every profile and the oracle, on
    this gateway's fleet with the edits asked for (``remove``, ``copies``, ``slots``, ``windows``), by
    ``turnout replay`` in a child process; the report, with the command that made it. 409 while
    another runs; a client that leaves stops its replay (the next one does not find it running)."""
    actor = _actor(request, state)
    if isinstance(actor, Response):
        return actor
    try:
        edits = msgspec.json.decode(await request.body() or b"{}", type=WhatIfEdits)
    except (msgspec.DecodeError, msgspec.ValidationError, RecursionError) as exc:
        return _api_error(400, f"send {{minutes, model, remove, copies, slots, windows}}: {exc}")
    watch = DisconnectWatch(request.receive)  # an admin who leaves mid-run stops the replay with them
    try:
        return _json(await watch.run(service_of(state).whatif(edits)))
    except whatif.WhatIfError as exc:
        return _api_error(409 if isinstance(exc, whatif.Busy) else 400, str(exc))
    except ClientDisconnected:  # nobody to answer; the next what-if need not wait for this one
        return _api_error(499, "the client left before the replay finished")
    finally:
        await watch.stop()


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
    found = await service_of(state).sessions(limit, query=q, min_turns=min_turns)
    return _json({"object": "list", **found})


@get("/sessions/{label:str}")
async def api_session(
    request: Request[Any, Any, Any], state: State, label: Annotated[str, PathParameter()]
) -> Response[bytes]:
    """One session and its timeline: every turn, and where a turn's prefix broke and what it cost."""
    session = await service_of(state).session(label)
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
        released = await service_of(state).release(label, actor)
    except AdminError as exc:
        return _api_error(404, str(exc))
    return _json({"released": [{"backend": b, "slot": s} for b, s in released]})


@get("/keys")
async def api_keys(request: Request[Any, Any, Any], state: State) -> Response[bytes]:
    """Per API key: its limits, requests and tokens in the last minute, running requests, and usage
    totals (requests that ended, their prompt, cached and completion tokens; since start, or with
    ``state.url`` kept in Redis for every replica). Names only, never keys."""
    return _json({"object": "list", "data": await service_of(state).core.access.usage()})


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
        await service_of(state).switch_profile(body.profile, actor)
    except AdminError as exc:
        return _api_error(400, str(exc))
    return _json(service_of(state).policy())


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
        await service_of(state).drain(backend_id, action == "drain", actor)
    except AdminError as exc:
        return _api_error(404, str(exc))
    return _json(service_of(state).policy())


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
        await service_of(state).pin(group, member, actor)
    except AdminError as exc:
        return _api_error(404 if isinstance(exc, UnknownGroup) else 400, str(exc))
    return _json(service_of(state).policy())


@get("/residency")
async def api_residency(request: Request[Any, Any, Any], state: State) -> Response[bytes]:
    """The residency sets: members, which one holds the GPUs, the switch running (its phase and
    steps) and the last switches with each step's seconds."""
    return _json({"object": "list", "data": service_of(state).core.residency.view()})


@post("/residency/{name:str}", status_code=202)
async def api_switch_residency(
    request: Request[Any, Any, Any], state: State, name: Annotated[str, PathParameter()]
) -> Response[bytes]:
    """``{"wake": "<backend>"}``: move the set's GPUs to that member (drain, free, wake, probe; runs in
    the background: follow it at ``GET /admin/api/residency``). 202 with the switch; 404 for an
    unknown set or member, 409 while another switch of the set runs."""
    actor = _actor(request, state)
    if isinstance(actor, Response):
        return actor
    try:
        target = msgspec.json.decode(await request.body(), type=AdminWake).wake
    except (msgspec.DecodeError, msgspec.ValidationError, RecursionError):
        return _api_error(400, 'send {"wake": "<backend id>"}')
    try:
        return _json(service_of(state).switch_residency(name, target, actor), 202)
    except AdminError as exc:
        return _api_error(409 if isinstance(exc, ResidencyBusy) else 404, str(exc))


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
        service_of(state).record(action == "start", actor)
    except AdminError as exc:
        return _api_error(400, str(exc))
    return _json(service_of(state).policy())


api_router = Router(
    path="/api",
    guards=[logged_in],
    route_handlers=[
        api_overview, api_bought, api_decisions, api_decision, api_predictions, api_slots, api_sessions,
        api_session, api_release, api_series, api_whatif_form, api_whatif,
        api_keys, api_policy, api_switch_profile, api_drain, api_pin, api_record, api_residency,
        api_switch_residency,
    ],
)  # fmt: skip
