"""Errors raised by backend adapters; every lower-level failure is translated here.

    UpstreamError                   anything that went wrong talking to an engine
    ├── UpstreamUnavailable         no response: connect refused, timeout, reset before headers
    ├── UpstreamStatusError         the engine answered with an error status (before streaming)
    └── UpstreamStreamError         the connection failed after the response had begun

Only ``UpstreamUnavailable`` and ``UpstreamStatusError`` with a 5xx status are worth another
backend: both happen before any byte reached the client.
"""

from __future__ import annotations

import re
from typing import Any

import msgspec


class UpstreamError(Exception):
    """Base class; ``backend_id`` names the engine."""

    def __init__(self, backend_id: str, message: str) -> None:
        super().__init__(message)
        self.backend_id = backend_id
        self.message = message


class UpstreamUnavailable(UpstreamError):
    """The engine could not be reached or did not answer in time."""

    retryable = True


class UpstreamStreamError(UpstreamError):
    """The engine's response broke off after it had started. ``gone``: the connection itself failed
    (closed or reset: the engine died or restarted), not merely a slow or malformed response."""

    def __init__(self, backend_id: str, message: str, *, gone: bool = False) -> None:
        super().__init__(backend_id, message)
        self.gone = gone


class UpstreamStatusError(UpstreamError):
    """The engine answered with an HTTP error.

    ``message``, ``type`` and ``code`` are normalised from whichever error shape the engine used
    (OpenAI-style, llama.cpp's, vLLM's bare ``{"error": "Unauthorized"}``, FastAPI's ``detail``).
    ``extra`` keeps engine-specific fields such as llama.cpp's ``n_prompt_tokens``/``n_ctx``.
    """

    def __init__(
        self,
        backend_id: str,
        status: int,
        message: str,
        error_type: str | None = None,
        extra: dict[str, Any] | None = None,
        param: str | None = None,
    ) -> None:
        super().__init__(backend_id, message)
        self.status = status
        self.error_type = error_type
        self.extra = extra or {}
        self.param = param

    @property
    def context_exceeded(self) -> bool:
        """llama.cpp's ``exceed_context_size_error``, or vLLM's 400 about the prompt's length."""
        return self.error_type == "exceed_context_size_error" or (
            self.status == 400 and self.param in ("input_tokens", "input_text")
        )

    @property
    def retryable(self) -> bool:
        return self.status >= 500

    def context_sizes(self) -> tuple[int | None, int | None]:
        """For a context overflow: the prompt's tokens and the window, as far as the engine said
        (llama.cpp: ``n_prompt_tokens``/``n_ctx``; vLLM: its message)."""
        prompt, window = self.extra.get("n_prompt_tokens"), self.extra.get("n_ctx")
        if isinstance(prompt, int) and isinstance(window, int):
            return prompt, window
        found_window = _VLLM_WINDOW.search(self.message)
        found_prompt = _VLLM_PROMPT.search(self.message)
        return (
            int(found_prompt.group(1)) if found_prompt else None,
            int(found_window.group(1)) if found_window else None,
        )


_VLLM_WINDOW = re.compile(r"maximum context length is (\d+) tokens")
_VLLM_PROMPT = re.compile(r"contains (?:at least )?(\d+) input tokens")
"""vLLM's ``VLLMValidationError`` wording (vllm/renderers/params.py, ``_token_len_check``)."""


def parse_error_body(backend_id: str, status: int, body: bytes) -> UpstreamStatusError:
    """Normalise an engine's error response into an :class:`UpstreamStatusError`."""
    message = body.decode("utf-8", "replace").strip()[:500] or f"HTTP {status}"
    error_type: str | None = None
    param: str | None = None
    extra: dict[str, Any] = {}
    try:
        data = msgspec.json.decode(body) if body else None
    except msgspec.DecodeError:
        data = None
    if isinstance(data, dict):
        error = data.get("error", data.get("detail"))
        if isinstance(error, dict):
            message = str(error.get("message", message))
            error_type = str(error["type"]) if error.get("type") is not None else None
            param = str(error["param"]) if error.get("param") is not None else None
            extra = {k: v for k, v in error.items() if k not in {"message", "type", "code", "param"}}
        elif isinstance(error, str):  # vLLM's --api-key failure: {"error": "Unauthorized"}
            message = error
        elif isinstance(error, list):  # FastAPI validation detail
            message = (
                "; ".join(str(item.get("msg", item)) for item in error if isinstance(item, dict)) or message
            )
    return UpstreamStatusError(backend_id, status, message, error_type, extra, param)
