"""Feature extraction: the few facts about a request that routing needs, computed once.

The body arrives already parsed (the gateway validated its shape); this module only reads it, and
the request's headers. Token counts are estimates from character counts, using a characters-per-token
ratio the caller passes in (a configured prior, or the learned one). ``request_features`` is the one
entry point the gateway calls: the body's facts, the model's group, and the size the request asks
for (``x-turnout-min-params-b``, a deep-reasoning request's floor).
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from typing import Any

import msgspec
from msgspec.structs import replace

from policies.awaited import awaited_of, client_of
from policies.prefix import MESSAGE_MARK, chain_of, message_text, render, render_completion
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


def user_starts(messages: Sequence[Any], stream: bytes) -> tuple[int, int]:
    """Where the first and the last user message start in ``stream`` (``render(messages)``), in
    bytes; a user message that starts the prompt is not counted (llama-server looks for a user
    message's start only after a token is in); -1 for none. A user message of tool results alone
    (Anthropic's ``tool_result`` blocks) is not one: the engines make tool messages of them, and
    llama-server ends a prefill step only at a user message's start (``EngineProfile.step_tokens``).
    The first is found walking forward from the prompt's start, the last walking back from its end:
    both walks are short however long the conversation."""
    rendered = [m for m in messages if isinstance(m, Mapping)]
    users = [
        i for i, m in enumerate(rendered) if m.get("role") == "user" and not _tool_results(m.get("content"))
    ]
    if not users:
        return -1, -1
    at = len(stream)
    for _ in range(len(rendered) - users[-1]):  # the last user message's mark, from the end
        at = stream.rfind(MESSAGE_MARK, 0, at)
    if at <= 0:  # it starts the prompt: so did every other one
        return -1, -1
    last = at
    at, seen = -1, 0
    for index in users:  # the first user message's mark past the prompt's start, from the start
        while seen <= index:
            at, seen = stream.find(MESSAGE_MARK, at + 1), seen + 1
        if at > 0:
            return at, last
    return last, last


def _tool_results(content: Any) -> bool:
    parts = content if isinstance(content, list) else []
    return bool(parts) and all(isinstance(p, Mapping) and p.get("type") == "tool_result" for p in parts)


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
    awaited, why = awaited_of(body, source, headers)
    messages = conversation(body, endpoint)
    ids = token_ids(body.get("prompt")) if endpoint is Endpoint.COMPLETIONS else None
    stream = (
        render_completion(body.get("prompt"))
        if endpoint is Endpoint.COMPLETIONS
        else render(messages, body.get("tools"))
    )
    first_user, last_user = (-1, -1) if endpoint is Endpoint.COMPLETIONS else user_starts(messages, stream)
    chain = chain_of(stream)
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
        chain=chain,
        user_share=last_user / len(stream) if last_user > 0 else -1.0,
        first_user_share=first_user / len(stream) if first_user > 0 else -1.0,
        first_user_bytes=first_user,
        shape=shape_of(messages, body.get("tools")) if shape and endpoint in SHAPED else None,
        prompt_chars=chars,
        needs_response_store=endpoint is Endpoint.RESPONSES and body.get("previous_response_id") is not None,
        awaited=awaited,
        awaited_why=why,
        client=client_of(headers or {}),
    )


SIZE_FLOOR_HEADER = "x-turnout-min-params-b"
REASONING_BUDGET_TOKENS = 16_000
"""An Anthropic ``thinking`` budget from which a request counts as asking for deep reasoning."""


class FeatureError(ValueError):
    """A request names something routing cannot read (the client's error: a 400 naming ``param``)."""

    def __init__(self, message: str, param: str) -> None:
        super().__init__(message)
        self.param = param


def size_floor(headers: Mapping[str, str]) -> float | None:
    """The ``x-turnout-min-params-b`` header: billions of parameters the answering model must have."""
    text = headers.get(SIZE_FLOOR_HEADER)
    if text is None:
        return None
    try:
        value = float(text)
    except ValueError:
        value = float("nan")
    if not math.isfinite(value) or value <= 0:
        raise FeatureError(
            f"{SIZE_FLOOR_HEADER} must be a positive number of billions of parameters, not {text[:40]!r}",
            SIZE_FLOOR_HEADER,
        )
    return value


def asks_deep_reasoning(body: Mapping[str, Any]) -> bool:
    """``reasoning_effort: "high"`` (Chat Completions), ``reasoning: {"effort": "high"}`` (Responses),
    or ``thinking: {"type": "enabled", "budget_tokens": >= REASONING_BUDGET_TOKENS}`` (Messages)."""
    if body.get("reasoning_effort") == "high":
        return True
    reasoning = body.get("reasoning")
    if isinstance(reasoning, Mapping) and reasoning.get("effort") == "high":
        return True
    thinking = body.get("thinking")
    if isinstance(thinking, Mapping) and thinking.get("type") == "enabled":
        budget = thinking.get("budget_tokens")
        return isinstance(budget, int) and budget >= REASONING_BUDGET_TOKENS
    return False


def output_cap(
    body: Mapping[str, Any], endpoint: Endpoint, limit: int | None, ceiling: int | None = None
) -> dict[str, int]:
    """The output limits to set: on a request that sets none, the model's configured
    ``max_output_tokens`` (``limit``: Codex never sends one; llama.cpp would otherwise generate until
    the window is full); on one that asks for more than the model's output limit (``ceiling``: what
    ``/v1/models`` advertises), that limit (a ``max_tokens`` of 10,000,000 reached the engine as the
    whole window)."""
    fields = OUTPUT_LIMIT_FIELDS.get(endpoint)
    if not fields:
        return {}
    asked = {f: body[f] for f in fields if body.get(f) is not None}
    if not asked:
        return {fields[0]: limit} if limit is not None else {}
    if ceiling is None:
        return {}
    return {f: ceiling for f, value in asked.items() if isinstance(value, int) and value > ceiling}


class ModelFacts(msgspec.Struct, frozen=True):
    """What routing reads of the model a request names (the gateway's catalog entry)."""

    name: str
    chars_per_token: float = DEFAULT_CHARS_PER_TOKEN
    members: tuple[str, ...] = ()
    prefer_default: float = 0.0
    reasoning_floor_b: float | None = None


def request_features(
    body: Mapping[str, Any], endpoint: Endpoint, headers: Mapping[str, str], model: ModelFacts
) -> RequestFeatures:
    """Everything routing reads of a request (``extract``, without the per-message shape: the
    gateway adds it once the request is on its way), with the model's group and the size it asks
    for: the header's floor, raised to the model's ``reasoning_floor_b`` for deep reasoning.
    Raises :class:`FeatureError` for a header routing cannot read."""
    features = extract(
        body, endpoint, model=model.name, headers=headers, chars_per_token=model.chars_per_token, shape=False
    )
    if model.members:
        features = replace(features, members=model.members, prefer_default=model.prefer_default)
    floor = size_floor(headers)
    if model.reasoning_floor_b is not None and asks_deep_reasoning(body):
        floor = max(floor or 0.0, model.reasoning_floor_b)
    if floor is not None:
        features = replace(features, min_params_b=floor)
    return features
