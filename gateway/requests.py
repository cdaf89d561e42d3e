"""Reading a client request: the body within its size limit, JSON decoding, shape checks.

Only what routing needs is checked here; everything else is the engine's to validate. One thing
more: how deep the JSON nests. Reading a prompt (``policies.prefix``, ``policies.features``) recurses
into content blocks and tool schemas, and so does the decoder itself, so a body nested a few
hundred levels deep would exhaust the stack and answer 500; it is refused here with a 400 instead.
"""

from __future__ import annotations

import asyncio
from typing import Any

import msgspec
from litestar import Request

from gateway.errors import InvalidRequest, PayloadTooLarge, RequestTimeout
from policies.types import Endpoint

MAX_DEPTH = 128
"""Deepest nesting of JSON arrays and objects accepted (a tool's JSON Schema 30 levels deep is ~65)."""


def nesting_exceeds(value: Any, limit: int) -> bool:
    """Whether ``value`` nests arrays and objects more than ``limit`` deep. Level by level, not
    recursive, so that checking a hostile body cannot exhaust the stack either."""
    level = [value] if isinstance(value, dict | list) else []
    for _ in range(limit):
        if not level:
            return False
        level = [
            child
            for item in level
            for child in (item.values() if isinstance(item, dict) else item)
            if isinstance(child, dict | list)
        ]
    return bool(level)


async def read_body(request: Request[Any, Any, Any], limit: int, timeout_s: float = 30.0) -> bytes:
    """The raw body; 413 as soon as it (or its declared length) passes ``limit``, 408 when it has
    not all arrived within ``timeout_s`` (a slow or stuck client holds nothing longer)."""
    declared = request.headers.get("content-length")
    if declared is not None and declared.isdigit() and int(declared) > limit:
        raise PayloadTooLarge(f"Request body of {declared} bytes exceeds the limit of {limit} bytes.")
    chunks: list[bytes] = []
    size = 0
    try:
        async with asyncio.timeout(timeout_s):
            async for chunk in request.stream():
                size += len(chunk)
                if size > limit:
                    raise PayloadTooLarge(f"Request body exceeds the limit of {limit} bytes.")
                chunks.append(chunk)
    except TimeoutError:
        raise RequestTimeout(f"The request body did not arrive within {timeout_s:g} s.") from None
    return b"".join(chunks)


def _require(body: dict[str, Any], key: str, kinds: tuple[type, ...], what: str) -> Any:
    if key not in body or body[key] is None:
        raise InvalidRequest(f"Missing required parameter: '{key}'.", param=key)
    value = body[key]
    if not isinstance(value, kinds) or isinstance(value, bool):
        raise InvalidRequest(f"Invalid type for '{key}': expected {what}.", param=key)
    return value


def parse_body(raw: bytes, endpoint: Endpoint) -> dict[str, Any]:
    """Decode and check the fields routing reads; 400 with the parameter named otherwise."""
    if not raw.strip():
        raise InvalidRequest("The request body is empty; expected a JSON object.")
    too_deep = InvalidRequest(f"The request body nests arrays and objects more than {MAX_DEPTH} levels deep.")
    try:
        body = msgspec.json.decode(raw)
    except msgspec.DecodeError as exc:
        raise InvalidRequest(f"The request body is not valid JSON: {exc}.") from exc
    except RecursionError:  # the decoder's own limit, far deeper than MAX_DEPTH
        raise too_deep from None
    if not isinstance(body, dict):
        raise InvalidRequest("The request body must be a JSON object.")
    if nesting_exceeds(body, MAX_DEPTH):
        raise too_deep
    _require(body, "model", (str,), "a string")
    if endpoint is Endpoint.RESPONSES:
        _require(body, "input", (str, list), "a string or an array of input items")
    elif endpoint is Endpoint.COMPLETIONS:
        _require(body, "prompt", (str, list), "a string or an array of strings")
    else:
        messages = _require(body, "messages", (list,), "an array of messages")
        if not messages:
            raise InvalidRequest("'messages' must contain at least one message.", param="messages")
        for index, message in enumerate(messages):
            if not isinstance(message, dict) or not isinstance(message.get("role"), str):
                raise InvalidRequest(
                    f"Invalid message at messages[{index}]: expected an object with a 'role'.",
                    param=f"messages[{index}]",
                )
    if endpoint is Endpoint.MESSAGES:
        value = _require(body, "max_tokens", (int,), "an integer")
        if value < 1:
            raise InvalidRequest("max_tokens: Input should be greater than or equal to 1", param="max_tokens")
    for key in ("max_tokens", "max_completion_tokens", "max_output_tokens"):
        value = body.get(key)
        if value is None:
            continue
        if not isinstance(value, int) or isinstance(value, bool):
            raise InvalidRequest(
                f"Invalid type for '{key}': expected an integer, but got {type(value).__name__} instead.",
                param=key,
                code="invalid_type",
            )
        if value < 1:  # every engine refuses it too, each in its own words: judged here, in the API's
            raise InvalidRequest(
                f"Invalid '{key}': integer below minimum value. Expected a value >= 1, but got {value} "
                "instead.",
                param=key,
                code="integer_below_min_value",
            )
    if "stream" in body and not isinstance(body["stream"], bool | None):
        raise InvalidRequest("Invalid type for 'stream': expected a boolean.", param="stream")
    return body
