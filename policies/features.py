"""Feature extraction: the few facts about a request body that routing needs, computed once.

The body arrives already parsed (the gateway validated its shape); this module only reads it.
Token counts are estimates from character counts, using a characters-per-token ratio the caller
passes in (a configured prior now, a learned value later).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from msgspec.structs import replace

from policies.prefix import chain_of, message_text, render, render_completion
from policies.sessions import explicit_session, responses_messages
from policies.shape import shape_of
from policies.types import Endpoint, RequestFeatures

MESSAGE_OVERHEAD_TOKENS = 4  # role markers and separators a chat template adds per message
DEFAULT_CHARS_PER_TOKEN = 3.6


def _tool_call_chars(message: Mapping[str, Any]) -> int:
    calls = message.get("tool_calls")
    if not isinstance(calls, list):
        return 0
    total = 0
    for call in calls:
        function = call.get("function") if isinstance(call, Mapping) else None
        if isinstance(function, Mapping):
            total += len(str(function.get("name", ""))) + len(str(function.get("arguments", "")))
    return total


def _json_chars(value: Any) -> int:
    """A cheap size estimate of a JSON value (tool schemas) without serialising it."""
    if isinstance(value, str):
        return len(value) + 2
    if isinstance(value, Mapping):
        return sum(len(str(k)) + 4 + _json_chars(v) for k, v in value.items())
    if isinstance(value, list):
        return sum(_json_chars(v) + 1 for v in value)
    return len(str(value))


def conversation(body: Mapping[str, Any], endpoint: Endpoint) -> list[Any]:
    """The request's messages in order, system first, whatever the API (empty for text completions)."""
    if endpoint is Endpoint.RESPONSES:
        return responses_messages(body)
    messages = body.get("messages")
    if not isinstance(messages, list):
        return []
    system = body.get("system") if endpoint.anthropic else None
    return ([{"role": "system", "content": system}] if system is not None else []) + messages


def token_ids(prompt: Any) -> int | None:
    """The number of tokens of a completion prompt given as token ids (``[1, 2, 3]``, the OpenAI
    form the engines accept): exact, no estimate needed; None for text."""
    if (
        isinstance(prompt, list)
        and prompt
        and all(isinstance(t, int) and not isinstance(t, bool) for t in prompt)
    ):
        return len(prompt)
    return None


def prompt_size(body: Mapping[str, Any], endpoint: Endpoint) -> tuple[int, int]:
    """``(characters of prompt text, template overhead tokens)`` of a request."""
    if endpoint is Endpoint.COMPLETIONS:
        prompt = body.get("prompt", "")
        chars = sum(len(p) for p in prompt if isinstance(p, str)) if isinstance(prompt, list) else len(prompt)
        return chars, 0
    chars = 0
    overhead = 0
    for message in conversation(body, endpoint):
        if isinstance(message, Mapping):
            chars += len(message_text(message.get("content"))) + _tool_call_chars(message)
            overhead += MESSAGE_OVERHEAD_TOKENS
    tools = body.get("tools")
    if isinstance(tools, list):
        chars += _json_chars(tools)
    return chars, overhead


def estimate_prompt_tokens(body: Mapping[str, Any], endpoint: Endpoint, chars_per_token: float) -> int:
    """Estimate the prompt's token count from its characters."""
    chars, overhead = prompt_size(body, endpoint)
    return max(1, round(chars / chars_per_token) + overhead)


def requested_max_tokens(body: Mapping[str, Any]) -> int | None:
    """The output budget the client asked for, under any of its accepted names."""
    for key in ("max_completion_tokens", "max_tokens", "max_output_tokens", "n_predict"):
        value = body.get(key)
        if isinstance(value, int) and not isinstance(value, bool) and value >= 0:
            return value
    return None


OUTPUT_LIMIT_FIELDS: Mapping[Endpoint, tuple[str, ...]] = {
    Endpoint.CHAT: ("max_tokens", "max_completion_tokens"),
    Endpoint.COMPLETIONS: ("max_tokens",),
    Endpoint.MESSAGES: ("max_tokens",),
    Endpoint.RESPONSES: ("max_output_tokens",),
}
"""Where each endpoint's body carries the output limit (the first: where one is set when none is)."""


def within_window(body: Mapping[str, Any], endpoint: Endpoint, window: int | None) -> dict[str, int]:
    """The output limits of ``body`` that exceed the deployment's context ``window``, each capped to
    it (docs/routing.md, "Output limits"): an engine can never give more, and the engines disagree on
    more (llama.cpp stops at the window's end, vLLM refuses with a 400 naming its own fields)."""
    capped: dict[str, int] = {}
    if window is None:  # not known: the engine decides
        return capped
    for field in OUTPUT_LIMIT_FIELDS.get(endpoint, ()):
        value = body.get(field)
        if isinstance(value, int) and not isinstance(value, bool) and value > window:
            capped[field] = window
    return capped


SHAPED = frozenset({Endpoint.CHAT, Endpoint.MESSAGES, Endpoint.RESPONSES})
"""Endpoints whose prompt is a conversation with a per-message shape (not text completions or counts)."""


def with_shape(features: RequestFeatures, body: Mapping[str, Any]) -> RequestFeatures:
    """``features`` with the prompt's per-message shape, if it has none yet and its endpoint has one."""
    if features.shape is not None or features.endpoint not in SHAPED:
        return features
    messages = conversation(body, features.endpoint)
    return replace(features, shape=shape_of(messages, body.get("tools")))


def extract(
    body: Mapping[str, Any],
    endpoint: Endpoint,
    *,
    model: str,
    headers: Mapping[str, str] | None = None,
    chars_per_token: float = DEFAULT_CHARS_PER_TOKEN,
    shape: bool = True,
) -> RequestFeatures:
    """Build the :class:`RequestFeatures` of a validated request body.

    ``model`` is the canonical model name (aliases already resolved by the caller); ``headers``
    have lower-case names. The session key is the explicit one, if any (see :mod:`policies.sessions`).
    ``shape``: also digest each message (:func:`shape_of`, for diagnostics only: no decision reads
    it); the gateway leaves it for later (:func:`with_shape`) and routes without it.
    """
    chars, overhead = prompt_size(body, endpoint)
    key, source = explicit_session(headers or {}, body)
    messages = conversation(body, endpoint)
    ids = token_ids(body.get("prompt")) if endpoint is Endpoint.COMPLETIONS else None
    return RequestFeatures(
        model=model,
        endpoint=endpoint,
        prompt_tokens=max(1, ids if ids is not None else round(chars / chars_per_token) + overhead),
        prompt_exact=ids is not None,
        prompt_counted="counted" if ids is not None else "estimate",
        max_tokens=requested_max_tokens(body),
        stream=bool(body.get("stream", False)),
        session_key=key,
        session_source=source,
        chain=chain_of(
            render_completion(body.get("prompt"))
            if endpoint is Endpoint.COMPLETIONS
            else render(messages, body.get("tools"))
        ),
        shape=shape_of(messages, body.get("tools")) if shape and endpoint in SHAPED else None,
        prompt_chars=chars,
        needs_response_store=endpoint is Endpoint.RESPONSES and body.get("previous_response_id") is not None,
    )
