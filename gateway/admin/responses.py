"""What every admin handler shares (``gateway.admin.views``' pages, ``gateway.admin.api_views``' JSON):
the admin service from the app's state, the caller's identity (``gateway.admin.auth``), the security
headers every page and JSON answer carries, and the query parameters both read (the windows in
minutes, how many sessions a list shows).
"""

from __future__ import annotations

from typing import Annotated, Any

from litestar import Request
from litestar.datastructures import State
from litestar.params import QueryParameter

from gateway.admin.auth import Identity
from gateway.admin.service import AdminService

SESSIONS_SHOWN = 200

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


def service_of(state: State) -> AdminService:
    """The admin service the app was built with (``state.admin``)."""
    service: AdminService = state.admin
    return service


def identity_of(request: Request[Any, Any, Any], state: State) -> Identity | None:
    """Who made the request (the admin token as a bearer, or a signed-in browser's cookie), or None."""
    return service_of(state).auth.identify(request)
