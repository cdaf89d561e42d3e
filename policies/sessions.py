"""Recognising a request's session: explicit keys first, else the conversation itself.

Priority (first match wins; ``features.session_source`` records which):

1. ``x-session-id`` header
2. an agent's own session header: ``x-claude-code-session-id``, ``session_id`` (Codex), ``x-session-affinity``
3. OpenAI ``prompt_cache_key``
4. OpenAI ``user``
5. Anthropic ``metadata.user_id``
6. implicit: the hashes of each message prefix, matched by the gateway against known sessions

Message prefixes are hashed in a canonical form (role, text content, tool calls, tool call id), so
a client that resends the same conversation in a different JSON layout still matches.
"""

from __future__ import annotations

import hashlib
from collections.abc import Mapping, Sequence
from typing import Any

from policies.types import SessionSource

AGENT_HEADERS = ("x-claude-code-session-id", "session_id", "x-session-affinity")
MAX_KEY_LENGTH = 256


def _part_text(part: Mapping[str, Any]) -> str:
    """Text of one content block: OpenAI parts, Anthropic text/tool_use/tool_result, Responses items."""
    if part.get("type") == "tool_use":
        return f"{part.get('name', '')}({part.get('input', '')})"
    for key in ("text", "content", "output", "arguments"):
        value = part.get(key)
        if value is not None:
            return value if isinstance(value, str) else message_text(value)
    return ""


def message_text(content: Any) -> str:
    """The text of a message's content: a string, or its blocks' texts joined by newlines."""
    if isinstance(content, str):
        return content
    if isinstance(content, list):
        parts = []
        for part in content:
            if isinstance(part, Mapping):
                parts.append(_part_text(part))
            elif isinstance(part, str):
                parts.append(part)
        return "\n".join(parts)
    return ""


def _tool_calls(message: Mapping[str, Any]) -> str:
    calls = message.get("tool_calls")
    if not isinstance(calls, list):
        return ""
    out = []
    for call in calls:
        function = call.get("function") if isinstance(call, Mapping) else None
        if isinstance(function, Mapping):
            out.append(f"{function.get('name', '')}({function.get('arguments', '')})")
    return ";".join(out)


def canonical(message: Mapping[str, Any]) -> bytes:
    """One message as bytes that ignore JSON layout: role, text, tool calls, tool call id."""
    fields = (
        str(message.get("role", "")),
        message_text(message.get("content")),
        _tool_calls(message),
        str(message.get("tool_call_id", "")),
    )
    return "\x1f".join(fields).encode("utf-8", "replace")


def _tool_names(tools: Any) -> bytes:
    if not isinstance(tools, list):
        return b""
    names = []
    for tool in tools:
        function = tool.get("function", tool) if isinstance(tool, Mapping) else None
        if isinstance(function, Mapping):
            names.append(str(function.get("name", "")) + ":" + str(len(str(function.get("parameters", "")))))
    return ",".join(names).encode()


def prefix_hashes(messages: Sequence[Any], system: Any = None, tools: Any = None) -> tuple[str, ...]:
    """``result[i]`` identifies messages ``0..i`` (with ``system`` first, as Anthropic sends it).

    The tool list is part of every prefix: engines render it into the prompt's head.
    """
    digest = hashlib.blake2b(digest_size=12)
    digest.update(_tool_names(tools) + b"\x1d")
    if system is not None:
        digest.update(canonical({"role": "system", "content": system}) + b"\x1e")
    hashes: list[str] = []
    for message in messages:
        if isinstance(message, Mapping):
            digest.update(canonical(message) + b"\x1e")
            hashes.append(digest.copy().hexdigest())
    return tuple(hashes)


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
                messages.append({"role": role, "content": item.get("content", _part_text(item))})
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
