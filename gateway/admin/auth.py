"""Who may use the admin pages: the admin token, a session cookie made from it, and CSRF tokens.

A browser logs in with the token (``POST /admin/login``) and gets an HttpOnly, SameSite=Strict cookie
``turnout_admin`` = ``<nonce>.<hmac>``; nothing is stored server-side, and a new token (a restart
with another one) logs every browser out. Actions are POSTs that must carry ``x-csrf-token`` (the
page holds it; another site can neither read it nor send the cookie). Scripts send
``Authorization: Bearer <token>`` instead and need no CSRF token.
"""

from __future__ import annotations

import hashlib
import hmac
import secrets
from dataclasses import dataclass
from typing import Any

from litestar.connection import ASGIConnection

COOKIE = "turnout_admin"
CSRF_HEADER = "x-csrf-token"


@dataclass(frozen=True, slots=True)
class Identity:
    """Who made a request: ``browser <nonce prefix>`` or ``token``, and from where."""

    who: str
    client: str
    nonce: str | None = None  # a browser session's, for its CSRF token


class AdminAuth:
    def __init__(self, token: str) -> None:
        self._token = token.encode()
        self._key = hashlib.sha256(b"turnout-admin-v1:" + self._token).digest()

    def _sign(self, purpose: str, nonce: str) -> str:
        return hmac.new(self._key, f"{purpose}:{nonce}".encode(), hashlib.sha256).hexdigest()

    def token_ok(self, candidate: str) -> bool:
        return hmac.compare_digest(candidate.encode(), self._token)

    def new_session(self) -> str:
        nonce = secrets.token_urlsafe(18)
        return f"{nonce}.{self._sign('session', nonce)}"

    def csrf_token(self, nonce: str) -> str:
        return self._sign("csrf", nonce)

    def identify(self, connection: ASGIConnection[Any, Any, Any, Any]) -> Identity | None:
        client = connection.client.host if connection.client else "?"
        bearer = connection.headers.get("authorization", "")
        if bearer.lower().startswith("bearer ") and self.token_ok(bearer[7:].strip()):
            return Identity("token", client)
        cookie = connection.cookies.get(COOKIE, "")
        nonce, _, signature = cookie.partition(".")
        if nonce and hmac.compare_digest(signature, self._sign("session", nonce)):
            return Identity(f"browser {nonce[:6]}", client, nonce)
        return None

    def csrf_ok(self, identity: Identity, connection: ASGIConnection[Any, Any, Any, Any]) -> bool:
        """Scripts (bearer) need none; a browser's POST must carry its session's CSRF token."""
        if identity.nonce is None:
            return True
        sent = connection.headers.get(CSRF_HEADER, "")
        return hmac.compare_digest(sent, self.csrf_token(identity.nonce))
