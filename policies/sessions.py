"""Recognising a request's session: explicit keys first, else the conversation itself.

Priority (first match wins; ``features.session_source`` records which):

1. ``x-session-id`` header
2. an agent's own session header: ``x-claude-code-session-id``, ``session-id`` (Codex 0.171;
   ``session_id`` before), ``x-session-affinity``
3. OpenAI ``prompt_cache_key``
4. OpenAI ``user``
5. Anthropic ``metadata.user_id``
6. implicit: the request's prompt extends the last prompt of a known session, found by the gateway
   in its content-addressed prefix index (``policies.prefix``)
"""

from __future__ import annotations

import hashlib
from collections.abc import Mapping
from typing import Any

from policies.prefix import part_text
from policies.types import SessionSource


def session_label(key: str) -> str:
    """A session's one short hash (12 hex), for logs, URLs, explanations and the decision log: session
    keys may be user ids. Where the operator may see names, the gateway shows the client's name for
    it instead (``gateway.decisions.session_shown``)."""
    return hashlib.blake2b(key.encode(), digest_size=6).hexdigest()


AGENT_HEADERS = ("x-claude-code-session-id", "session-id", "session_id", "x-session-affinity")
MAX_KEY_LENGTH = 256


def responses_messages(body: Mapping[str, Any]) -> list[Any]:
    """A Responses request's ``instructions`` and ``input`` as chat-like messages, for hashing."""
    messages: list[Any] = []
    if isinstance(body.get("instructions"), str):
        messages.append({"role": "system", "content": body["instructions"]})
    items = body.get("input")
    if isinstance(items, str):
        messages.append({"role": "user", "content": items})
    elif isinstance(items, list):
        for item in items:
            if isinstance(item, Mapping):
                role = item.get("role") or item.get("type", "item")
                messages.append({"role": role, "content": item.get("content", part_text(item))})
    return messages


def _clean(value: Any) -> str | None:
    if isinstance(value, str) and value.strip():
        return value.strip()[:MAX_KEY_LENGTH]
    return None


def explicit_session(headers: Mapping[str, str], body: Mapping[str, Any]) -> tuple[str | None, SessionSource]:
    """The session key the client named, and where; ``(None, NONE)`` when it named none.

    ``headers`` has lower-case names. Keys from different sources never collide: each is
    prefixed with its source.
    """
    if key := _clean(headers.get("x-session-id")):
        return f"h:{key}", SessionSource.HEADER
    for name in AGENT_HEADERS:
        if key := _clean(headers.get(name)):
            return f"a:{key}", SessionSource.AGENT_HEADER
    if key := _clean(body.get("prompt_cache_key")):
        return f"k:{key}", SessionSource.PROMPT_CACHE_KEY
    if key := _clean(body.get("user")):
        return f"u:{key}", SessionSource.USER
    metadata = body.get("metadata")
    if isinstance(metadata, Mapping) and (key := _clean(metadata.get("user_id"))):
        return f"m:{key}", SessionSource.METADATA
    return None, SessionSource.NONE
