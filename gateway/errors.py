"""The gateway's error tree, and its one translation into client-facing JSON.

    GatewayError                       rendered as {"error": {"message", "type", "param", "code"}}
    │                                  (Anthropic endpoints: {"type": "error", "error": {"type", "message"}})
    ├── InvalidRequest            400  bad JSON, missing or mistyped fields
    │   └── ContextLengthExceeded 400  the prompt fits no backend serving the model
    ├── ModelNotFound             404  unknown model (the message lists valid names)
    ├── PayloadTooLarge           413  body over limits.max_body_bytes
    ├── NoBackendAvailable        503  every candidate dropped (the message says why)
    └── UpstreamFailed            502  the engine failed or refused turnout itself

Upstream errors (:mod:`backends.errors`) become gateway errors in :func:`from_upstream`, the one
place that decides which engine failures are the client's and which are the gateway's.
"""

from __future__ import annotations

import re
from typing import ClassVar

import msgspec

from backends.errors import UpstreamError, UpstreamStatusError
from gateway.api import anthropic, openai
from policies import Endpoint


class GatewayError(Exception):
    status: int = 500
    type: ClassVar[str] = "server_error"
    code: ClassVar[str | None] = None

    def __init__(self, message: str, *, param: str | None = None, code: str | None = None) -> None:
        super().__init__(message)
        self.message = message
        self.param = param
        self.error_code = code or self.code
        self.routing: dict[str, str] = {}
        """``x-turnout-*`` headers of the decision behind an error that came after routing (an
        engine's refusal relayed): which backend said it, and why it was chosen."""

    @property
    def headers(self) -> dict[str, str]:
        """Extra response headers (``retry-after`` on a 429), and the decision's (``routing``)."""
        return {**self.routing, **self._headers()}

    def _headers(self) -> dict[str, str]:
        return {}

    def openai_body(self) -> bytes:
        return openai_error_body(self.message, self.type, self.param, self.error_code)

    def anthropic_body(self) -> bytes:
        return anthropic_error_body(self.status, self.message)


class InvalidRequest(GatewayError):
    status = 400
    type = "invalid_request_error"


class ContextLengthExceeded(InvalidRequest):
    """The prompt fits no backend. Worded as each API words it, because agents recover by matching
    the words: Claude Code compacts on Anthropic's ``prompt is too long: N tokens > M maximum``,
    OpenAI clients (Codex among them) on the code ``context_length_exceeded``."""

    code = "context_length_exceeded"

    def __init__(
        self,
        message: str,
        *,
        param: str | None = None,
        prompt_tokens: int | None = None,
        window: int | None = None,
    ) -> None:
        self.prompt_tokens = prompt_tokens
        self.window = window
        if prompt_tokens is not None and window is not None:
            message = (
                f"This model's maximum context length is {window} tokens. However, your "
                f"{'prompt' if param == 'prompt' else 'messages'} resulted in {prompt_tokens} tokens. "
                f"Please reduce the length of the {'prompt' if param == 'prompt' else 'messages'}. "
                f"({message})"
            )
        super().__init__(message, param=param)

    def anthropic_body(self) -> bytes:
        if self.prompt_tokens is None or self.window is None:
            return super().anthropic_body()
        return anthropic_error_body(
            self.status, f"prompt is too long: {self.prompt_tokens} tokens > {self.window} maximum"
        )


class ModelNotFound(GatewayError):
    status = 404
    type = "invalid_request_error"
    code = "model_not_found"


class PayloadTooLarge(GatewayError):
    status = 413
    type = "invalid_request_error"
    code = "request_too_large"


class RequestTimeout(GatewayError):
    status = 408
    type = "invalid_request_error"
    code = "request_timeout"


class HeadersTooLarge(GatewayError):
    status = 431
    type = "invalid_request_error"
    code = "request_header_fields_too_large"


class NoBackendAvailable(GatewayError):
    status = 503
    type = "service_unavailable_error"
    code = "no_backend_available"


class ShuttingDown(GatewayError):
    """The gateway is draining before it exits: another replica (or this one restarted) will answer."""

    status = 503
    type = "service_unavailable_error"
    code = "shutting_down"

    def _headers(self) -> dict[str, str]:
        return {"retry-after": "1", "connection": "close"}


class UpstreamFailed(GatewayError):
    status = 502
    type = "upstream_error"
    code = "upstream_failed"


class UpstreamRejected(GatewayError):
    """The engine refused the request as the client sent it; its status is kept."""

    type = "invalid_request_error"

    def __init__(self, status: int, message: str, code: str | None = None, param: str | None = None) -> None:
        super().__init__(message, code=code, param=param)
        self.status = status


def openai_error_body(message: str, type_: str, param: str | None = None, code: str | None = None) -> bytes:
    """OpenAI's error shape (:class:`gateway.api.openai.OpenAIError`)."""
    return openai.error_body(message, type_, param, code)


def anthropic_error_body(status: int, message: str) -> bytes:
    """Anthropic's error shape: ``{"type": "error", "error": {"type", "message"}}``
    (:class:`gateway.api.anthropic.AnthropicError`)."""
    return anthropic.error_body(status, message)


def stream_api(endpoint: Endpoint) -> str:
    """Which API's stream a request on ``endpoint`` gets: its error event's shape (``stream_error_event``)."""
    if endpoint.anthropic:
        return "anthropic"
    return "responses" if endpoint is Endpoint.RESPONSES else "openai"


def stream_error_event(api: str, error: GatewayError) -> bytes:
    """An error after a stream began, as each API's clients expect it, ending the stream."""
    if api == "anthropic":
        return b"event: error\ndata: " + error.anthropic_body() + b"\n\n"
    if api == "responses":  # response.failed: Codex ignores a bare `error` event and retries 5 times
        failed = {
            "type": "response.failed",
            "response": {
                "id": "resp_failed",
                "object": "response",
                "status": "failed",
                "error": {"type": error.type, "code": error.error_code, "message": error.message},
            },
        }
        return b"event: response.failed\ndata: " + msgspec.json.encode(failed) + b"\n\n"
    return b"data: " + error.openai_body() + b"\n\ndata: [DONE]\n\n"


_CLIENT_STATUSES = frozenset({400, 413, 422})
_NO_SUCH_RESPONSE = re.compile(r"^Response with id '.*' not found")
"""vLLM's 404 for a ``previous_response_id`` it does not keep (the client's, not turnout's, mistake)."""


def from_upstream(error: UpstreamError) -> GatewayError:
    """Translate an engine failure for the client.

    A 400/413/422 is about the request: the client gets the engine's own message with its
    status (llama.cpp's ``exceed_context_size_error`` becomes ``context_length_exceeded``).
    429 stays 429. vLLM's 404 for an unknown ``previous_response_id`` is the 400 OpenAI answers
    (code ``previous_response_not_found``: Codex then sends the whole conversation). Anything else
    (auth or model errors caused by turnout's config, 5xx, no answer) is the gateway's problem:
    502, naming the backend.
    """
    if isinstance(error, UpstreamStatusError):
        if error.status == 404 and _NO_SUCH_RESPONSE.match(error.message):
            return UpstreamRejected(400, error.message, "previous_response_not_found", "previous_response_id")
        if error.status in _CLIENT_STATUSES:
            code = "context_length_exceeded" if error.context_exceeded else None
            return UpstreamRejected(400 if error.status == 422 else error.status, error.message, code)
        if error.status == 429:
            return UpstreamRejected(429, error.message, "rate_limited")
        return UpstreamFailed(f"backend {error.backend_id} answered {error.status}: {error.message}")
    return UpstreamFailed(f"backend {error.backend_id} failed: {error.message}")
