"""vLLM 0.32 error bodies for request validation and context length (pure builders)."""

from __future__ import annotations

from typing import Any

from litestar import Response

from backends.sim.http_common import json_response
from backends.sim.vllm_wire import error_body


def validation_error(
    kind: str, loc: tuple[str | int, ...], msg: str, given: Any, param: str | None
) -> Response[bytes]:
    """The 400 a pydantic ``RequestValidationError`` becomes (``type`` is the HTTP phrase ``Bad Request``).

    Message: ``"1 validation error:\\n  {'type': ..., 'loc': ..., 'msg': ..., 'input': ...}"``.
    """
    shown = given if len(repr(given)) <= 200 else "{...}"
    detail = {"type": kind, "loc": loc, "msg": msg, "input": shown}
    return json_response(error_body(f"1 validation error:\n  {detail}", "Bad Request", 400, param), 400)


def context_error(n_prompt: int, max_tokens: int | None, max_model_len: int) -> Response[bytes] | None:
    """The 400 for a prompt that cannot fit, or None (``prompt + max_tokens`` overflow is clamped instead).

    * ``n_prompt > M``: "This model's maximum context length is M tokens. However, your prompt contains N
      input tokens, which exceeds this limit even without any output tokens. ..." (``param: input_tokens``)
    * ``n_prompt == M``: the engine's "The decoder prompt (length N) plus ..." message
    * ``max_tokens > M``: "max_tokens=X cannot be greater than max_model_len=M. ..."
    """
    m = max_model_len
    if n_prompt > m:
        message = (
            f"This model's maximum context length is {m} tokens. However, your prompt contains "
            f"{n_prompt} input tokens, which exceeds this limit even without any output tokens. "
            "Please reduce the length of the input prompt."
        )
        return json_response(error_body(message, "BadRequestError", 400, "input_tokens"), 400)
    if n_prompt == m:
        message = (
            f"The decoder prompt (length {n_prompt}) plus the number of requested output tokens "
            f"(at least 1) is longer than the maximum model length of {m}. Make sure that "
            "`max_model_len` is no smaller than the number of text tokens (prompt + requested output "
            "tokens)."
        )
        return json_response(error_body(message, "BadRequestError", 400, None), 400)
    if max_tokens is not None and max_tokens > m:
        message = (
            f"max_tokens={max_tokens} cannot be greater than max_model_len={m}. "
            "Please request fewer output tokens."
        )
        return json_response(error_body(message, "BadRequestError", 400, "max_tokens"), 400)
    return None
