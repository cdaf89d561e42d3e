"""vLLM 0.32 error bodies for request validation and context length (pure builders).

Two families, as in ``entrypoints/serve/exception_handling``:

* FastAPI's ``RequestValidationError`` (bad JSON, missing fields, wrong body type): ``type`` is the
  HTTP phrase ``Bad Request``, ``param`` the error's dotted ``loc``, and the message lists the
  pydantic errors with ``loc`` dotted and ``input`` summarised (containers become ``<dict of N items>``).
* ``VLLMValidationError`` (context length, ``max_tokens``, ``stream_options`` without ``stream``):
  ``type`` ``BadRequestError``, ``param`` the parameter, and the message ends with
  ``(parameter=..., value=...)``.
"""

from __future__ import annotations

import json
from typing import Any

from litestar import Response

from backends.sim.http_common import json_response
from backends.sim.vllm_wire import error_body

MAX_INPUT_CHARS = 200
MAX_CHARS_PER_TOKEN = 13
"""vLLM refuses text longer than ``max_model_len * tokenizer.max_chars_per_token`` characters before
tokenizing it. 13 is the longest piece of the simulator's tokenizer (``<|endoftext|>``), and happens
to be what the tiny test model's tokenizer reports too."""


def summarize_input(value: Any) -> Any:
    """vLLM's ``_summarize_error_input``: containers are described, long strings cut."""
    if isinstance(value, list | tuple | set | frozenset | dict):
        return f"<{type(value).__name__} of {len(value)} items>"
    text = value if isinstance(value, str) else str(value)
    return text[:MAX_INPUT_CHARS] + "...[truncated]" if len(text) > MAX_INPUT_CHARS else text


def validation_error(
    kind: str, loc: tuple[str | int, ...], msg: str, given: Any, ctx: dict[str, Any] | None = None
) -> Response[bytes]:
    """The 400 a pydantic ``RequestValidationError`` becomes (``type`` is the HTTP phrase ``Bad Request``).

    Message: ``"1 validation error:\\n  {'type': ..., 'loc': 'body.x', 'msg': ..., 'input': ...}"``.
    """
    dotted = ".".join(str(part) for part in loc)
    detail: dict[str, Any] = {"type": kind, "loc": dotted, "msg": msg, "input": summarize_input(given)}
    if ctx is not None:
        detail["ctx"] = ctx
    return json_response(error_body(f"1 validation error:\n  {detail}", "Bad Request", 400, dotted), 400)


def json_error(raw: bytes) -> Response[bytes]:
    """Malformed JSON: ``json_invalid`` at the decoder's character position, with its message."""
    position, reason = 0, "Expecting value"
    try:
        json.loads(raw)
    except json.JSONDecodeError as exc:
        position, reason = exc.pos, exc.msg
    except UnicodeDecodeError as exc:
        position, reason = exc.start, str(exc)
    return validation_error("json_invalid", ("body", position), "JSON decode error", {}, {"error": reason})


def vllm_validation_error(message: str, param: str | None, value: Any = None) -> Response[bytes]:
    """A ``VLLMValidationError``: ``BadRequestError`` whose message ends ``(parameter=.., value=..)``."""
    extras = [f"{name}={item}" for name, item in (("parameter", param), ("value", value)) if item is not None]
    text = f"{message} ({', '.join(extras)})" if extras else message
    return json_response(error_body(text, "BadRequestError", 400, param), 400)


def context_error(
    n_prompt: int,
    max_tokens: int | None,
    max_model_len: int,
    *,
    n_chars: int | None = None,
    max_tokens_param: str = "max_tokens",
) -> Response[bytes] | None:
    """The 400 for a prompt that cannot fit, or None (``prompt + max_tokens`` overflow is clamped instead).

    ``n_chars`` is the length of the text the server tokenizes itself (the rendered chat, a text
    prompt), None for a token-id prompt; ``max_tokens_param`` is how the endpoint names the output
    budget (``max_completion_tokens`` for Anthropic Messages, ``max_output_tokens`` for Responses).
    In vLLM's order:

    * ``max_tokens > M``: "max_tokens=X cannot be greater than max_model_len=M. ..."
    * ``n_chars > M * MAX_CHARS_PER_TOKEN``: "... your prompt contains C characters (more than ...
      characters, which is the upper bound for M input tokens). ..." (``param: input_text``)
    * ``n_prompt > M``: "This model's maximum context length is M tokens. However, your prompt contains
      [at least] N input tokens, which exceeds this limit even without any output tokens. ..."
      (``param: input_tokens``). Text the server tokenizes itself is cut at ``M + 1`` tokens first,
      so it reports "at least M+1"; a token-id prompt reports its length.
    * ``n_prompt == M``: the engine's "The decoder prompt (length N) plus ..." message
    """
    m = max_model_len
    if max_tokens is not None and max_tokens > m:
        message = (
            f"{max_tokens_param}={max_tokens} cannot be greater than max_model_len={m}. "
            "Please request fewer output tokens."
        )
        return vllm_validation_error(message, max_tokens_param, max_tokens)
    if n_chars is not None and n_chars > m * MAX_CHARS_PER_TOKEN:
        message = (
            f"This model's maximum context length is {m} tokens. However, your prompt contains "
            f"{n_chars} characters (more than {m * MAX_CHARS_PER_TOKEN} characters, which is the upper "
            f"bound for {m} input tokens). Please reduce the length of the input prompt."
        )
        return vllm_validation_error(message, "input_text", n_chars)
    if n_prompt > m:
        count = m + 1 if n_chars is not None else n_prompt
        qualifier = "at least " if count == m + 1 else ""
        message = (
            f"This model's maximum context length is {m} tokens. However, your prompt contains "
            f"{qualifier}{count} input tokens, which exceeds this limit even without any output tokens. "
            "Please reduce the length of the input prompt."
        )
        return vllm_validation_error(message, "input_tokens", count)
    if n_prompt == m:
        message = (
            f"The decoder prompt (length {n_prompt}) plus the number of requested output tokens "
            f"(at least 1) is longer than the maximum model length of {m}. Make sure that "
            "`max_model_len` is no smaller than the number of text tokens (prompt + requested output "
            "tokens)."
        )
        return vllm_validation_error(message, None)
    return None
