"""``/schema/openapi.json``: litestar's document of the routes with turnout's bodies laid in.

litestar 2 generates paths, operation ids, parameters and descriptions from the handlers, but it
documents a request body only for a handler that takes ``data`` (and so decodes the body before the
handler runs), and one media type per status. The agents' handlers take the raw request (the relay
streams the body within its size limit and decodes it once) and answer JSON *or* an event stream.
So :data:`OPERATIONS` says, per operation, what goes in and what comes out, as the Structs of
:mod:`gateway.api`; :func:`complete` turns them into JSON Schema with msgspec's generator (one
generator for every body, so a type is one component) and lays them over litestar's document once,
when the schema is first served (:class:`SchemaDocument`).

Event streams are documented the OpenAPI 3.1 way schemathesis and other tools read: the
``text/event-stream`` schema describes one event (``{"event", "data"}``), ``data`` a JSON text
(``contentMediaType``/``contentSchema``) or the terminal ``[DONE]``.
"""

from __future__ import annotations

import copy
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

import msgspec
from litestar import Request
from litestar.openapi import OpenAPIConfig
from litestar.openapi.plugins import JsonRenderPlugin

from gateway.admin import service as admin
from gateway.api import anthropic, openai, responses, service
from gateway.metrics import CONTENT_TYPE as METRICS_TEXT
from gateway.requests import MAX_DEPTH

JSON = "application/json"
SSE = "text/event-stream"
REF = "#/components/schemas/{name}"
SCHEMA_PATH = "/schema"
SCHEMA_FILE = "/openapi.json"


@dataclass(frozen=True, slots=True)
class Reply:
    """One documented status: a JSON body (one of ``json``), an event stream (each event's data one
    of ``sse``), or text. Alternatives are tuples: msgspec refuses unions of untagged Structs."""

    description: str
    json: tuple[Any, ...] = ()
    sse: tuple[Any, ...] = ()
    done: bool = False  # the stream ends with ``data: [DONE]``
    text: str | None = None  # a media type whose body is plain text
    headers: Mapping[str, dict[str, Any]] = field(default_factory=dict)  # besides x-request-id


@dataclass(frozen=True, slots=True)
class Operation:
    """What one operation takes (``request``: its JSON body; ``parameters`` beside litestar's, same
    names replaced) and answers per status. ``security`` names schemes of :data:`SECURITY_SCHEMES`,
    needed only when ``required_security`` (``/v1`` is open until ``auth.keys`` are configured)."""

    replies: Mapping[int, Reply]
    request: Any = None
    parameters: tuple[dict[str, Any], ...] = ()
    security: tuple[str, ...] = ()
    required_security: bool = False

    def types(self) -> list[Any]:
        found = [self.request] if self.request is not None else []
        for reply in self.replies.values():
            found += [*reply.json, *reply.sse]
        return found


def _header(name: str, description: str) -> dict[str, Any]:
    return {
        "name": name,
        "in": "header",
        "required": False,
        "schema": {"type": "string"},
        "description": description,
    }


def _query(name: str, schema: dict[str, Any], description: str) -> dict[str, Any]:
    return {"name": name, "in": "query", "required": False, "schema": schema, "description": description}


SESSION_HEADERS = (
    _header("x-session-id", "names the session (first of the session keys; docs/routing.md)"),
    _header("x-claude-code-session-id", "Claude Code's session id: a session key"),
    _header("session-id", "Codex's session id: a session key"),
    _header("x-session-affinity", "a session key"),
    _header("x-request-id", "kept as the request's id when sane (1-128 of A-Z a-z 0-9 . _ : -)"),
)
ANTHROPIC_VERSION = _header("anthropic-version", "present: Anthropic's shapes (bodies and errors)")
ANTHROPIC_HEADERS = (
    _header("anthropic-version", "accepted, not checked"),
    _header("anthropic-beta", "accepted, passed to the engine"),
    _query("beta", {"type": "string"}, "accepted (Claude Code sends ?beta=true)"),
)
MODEL_LIST_PARAMETERS = (
    ANTHROPIC_VERSION,
    _query("limit", {"type": "integer", "minimum": 1, "maximum": 1000}, "Anthropic's page size (default 20)"),
    _query("after_id", {"type": "string"}, "Anthropic's paging: the page after this model"),
    _query("before_id", {"type": "string"}, "Anthropic's paging: the page before this model"),
    _query("client_version", {"type": "string"}, "Codex: add its model catalog under `models`"),
)
MODEL_ID = {
    "name": "model_id",
    "in": "path",
    "required": True,
    "schema": {"type": "string"},  # litestar says `format: uri` for a `path` parameter
    "description": "a model name or alias (it may hold slashes)",
}

V1_ERRORS = {
    400: f"bad JSON (or nested more than {MAX_DEPTH} levels deep), or a missing or mistyped field routing "
    "reads (the message names it); the prompt fits no backend (code `context_length_exceeded`); "
    "`previous_response_id` where no engine keeps responses, or one the engine does not keep (code "
    "`previous_response_not_found`); an engine's own 400 or 422",
    401: "a missing or wrong API key (only when `auth.keys` are configured)",
    404: "unknown model (the message lists the valid names), or one the key may not use",
    408: "the body did not arrive within `limits.body_timeout_s`",
    413: "the body is over `limits.max_body_bytes` (or the engine's own limit)",
    429: "over the key's requests, concurrent requests or tokens per minute (`retry-after` says when), "
    "or the engine's 429",
    431: "the request's headers are over `limits.max_header_bytes` in all",
    502: "the engine failed, or refused turnout itself (e.g. a wrong upstream key)",
    503: "every candidate backend is down, loading, drained, its circuit open, or otherwise dropped; or "
    "turnout is shutting down (code `shutting_down`, `retry-after`); the message says why",
}
MODEL_ERRORS = {status: V1_ERRORS[status] for status in (400, 401)}
ANY_ERROR = (openai.OpenAIError, anthropic.AnthropicError)


def _string(description: str) -> dict[str, Any]:
    return {"schema": {"type": "string"}, "description": description}


ROUTED = {
    "x-turnout-backend": {**_string("the backend that answered"), "required": True},
    "x-turnout-route-reason": {**_string("why it was chosen (docs/routing.md)"), "required": True},
    "x-turnout-slot": _string("the llama.cpp slot the request was pinned to"),
    "x-turnout-session-source": _string("where the session key came from: header, agent-header, ..."),
}
REQUEST_ID = {"x-request-id": {**_string("the request's id, in every log line of it"), "required": True}}
RETRY_AFTER = {"retry-after": _string("seconds until the key's limits admit the request again")}


def _v1_errors(*errors: Any) -> dict[int, Reply]:
    return {
        status: Reply(why, json=errors, headers=RETRY_AFTER if status == 429 else {})
        for status, why in V1_ERRORS.items()
    }


def _inference(request: Any, body: Any, event: Any, error: Any, *, done: bool) -> Operation:
    answer = "the engine's answer (with `stream`: an event stream)"
    ok = Reply(answer, json=(body,), sse=(event, error), done=done, headers=ROUTED)
    return Operation(
        {200: ok, **_v1_errors(error)},
        request=request,
        parameters=(*SESSION_HEADERS, *(ANTHROPIC_HEADERS if error is anthropic.AnthropicError else ())),
        security=("apiKey", "anthropicKey"),
    )


DECISION_FILTERS = tuple(
    _query(name, {"type": "string"}, f"only decisions with this {name}") for name in admin.DECISION_FILTERS
)


def _admin(
    ok: Any, *errors: int, request: Any = None, parameters: tuple[dict[str, Any], ...] = ()
) -> Operation:
    why = {
        400: "a malformed request, or an action the config does not allow (the message says what)",
        401: "no admin session cookie and no `Authorization: Bearer <admin token>`",
        403: "a browser session without the right `x-csrf-token`",
        404: "no such decision, session, backend, model group or action",
        409: "another what-if is running",
    }
    replies = {200: Reply("OK", json=(ok,))}
    replies.update({status: Reply(why[status], json=(service.AdminError,)) for status in (401, *errors)})
    return Operation(
        replies, request=request, parameters=parameters, security=("adminToken",), required_security=True
    )


OPERATIONS: dict[tuple[str, str], Operation] = {
    ("post", "/v1/chat/completions"): _inference(
        openai.ChatCompletionRequest, openai.ChatCompletion, openai.ChatCompletionChunk, openai.OpenAIError,
        done=True,
    ),
    ("post", "/v1/completions"): _inference(
        openai.CompletionRequest, openai.Completion, openai.Completion, openai.OpenAIError, done=True
    ),
    ("post", "/v1/messages"): _inference(
        anthropic.MessagesRequest, anthropic.MessageResponse, anthropic.StreamEvent, anthropic.AnthropicError,
        done=False,
    ),
    ("post", "/v1/messages/count_tokens"): Operation(
        {200: Reply("the engine's count", json=(anthropic.CountTokensResponse,), headers=ROUTED),
         **_v1_errors(anthropic.AnthropicError)},
        request=anthropic.CountTokensRequest,
        parameters=ANTHROPIC_HEADERS,
        security=("apiKey", "anthropicKey"),
    ),
    ("post", "/v1/responses"): _inference(
        responses.ResponsesRequest, responses.Response, responses.ResponsesEvent, openai.OpenAIError,
        done=False,
    ),
    ("get", "/v1/models"): Operation(
        {200: Reply("OpenAI's list, or with `anthropic-version` Anthropic's page",
                    json=(service.ModelList, service.AnthropicModelPage)),
         **{status: Reply(why, json=ANY_ERROR) for status, why in MODEL_ERRORS.items()}},
        parameters=MODEL_LIST_PARAMETERS,
        security=("apiKey", "anthropicKey"),
    ),
    ("get", "/v1/models/{model_id}"): Operation(
        {200: Reply("OpenAI's model object, or with `anthropic-version` Anthropic's",
                    json=(service.Model, service.AnthropicModel)),
         401: Reply(V1_ERRORS[401], json=ANY_ERROR),
         404: Reply(V1_ERRORS[404], json=ANY_ERROR)},
        parameters=(MODEL_ID, ANTHROPIC_VERSION),
        security=("apiKey", "anthropicKey"),
    ),
    ("get", "/health"): Operation(
        {200: Reply("at least one backend is ready (or not probed yet)", json=(service.Health,)),
         503: Reply("no backend is ready", json=(service.Health,))}
    ),
    ("get", "/metrics"): Operation({200: Reply("Prometheus text (docs/metrics.md)", text=METRICS_TEXT)}),
    ("get", "/admin/api/overview"): _admin(dict[str, Any]),
    ("get", "/admin/api/bought"): _admin(dict[str, Any]),
    ("get", "/admin/api/decisions"): _admin(service.AdminList, 400, parameters=DECISION_FILTERS),
    ("get", "/admin/api/decisions/{request_id}"): _admin(dict[str, Any], 404),
    ("get", "/admin/api/predictions"): _admin(dict[str, Any], 400),
    ("get", "/admin/api/sessions"): _admin(service.AdminList, 400),
    ("get", "/admin/api/sessions/{label}"): _admin(dict[str, Any], 404),
    ("post", "/admin/api/sessions/{label}/release"): _admin(dict[str, Any], 403, 404),
    ("get", "/admin/api/series"): _admin(dict[str, Any], 400),
    ("get", "/admin/api/slots"): _admin(dict[str, Any], 400),
    ("get", "/admin/api/whatif"): _admin(dict[str, Any]),
    ("post", "/admin/api/whatif"): _admin(dict[str, Any], 400, 403, 409, request=service.WhatIfEdits),
    ("get", "/admin/api/keys"): _admin(service.AdminList),
    ("get", "/admin/api/policy"): _admin(dict[str, Any]),
    ("post", "/admin/api/policy/profile"): _admin(dict[str, Any], 400, 403, request=service.AdminProfile),
    ("post", "/admin/api/backends/{backend_id}/{action}"): _admin(dict[str, Any], 403, 404),
    ("post", "/admin/api/record/{action}"): _admin(dict[str, Any], 400, 403, 404),
    ("post", "/admin/api/groups/{group}/{action}"):
        _admin(dict[str, Any], 400, 403, 404, request=service.AdminPin),
    ("get", "/admin/api/residency"): _admin(service.AdminList),
    ("post", "/admin/api/residency/{name}"):
        _admin(dict[str, Any], 400, 403, 404, 409, request=service.AdminWake),
}  # fmt: skip
"""Every operation the document describes; :func:`complete` fails on one litestar does not know."""

SECURITY_SCHEMES = {
    "apiKey": {"type": "http", "scheme": "bearer", "description": "an API key from `auth.keys`"},
    "anthropicKey": {"type": "apiKey", "in": "header", "name": "x-api-key", "description": "the same key"},
    "adminToken": {"type": "http", "scheme": "bearer", "description": "the admin token (`admin.token`)"},
}


def _event_stream(data: dict[str, Any], done: bool) -> dict[str, Any]:
    """One server-sent event whose data is a JSON text matching ``data`` (or ``[DONE]``)."""
    payload = {"type": "string", "contentMediaType": JSON, "contentSchema": data}
    return {
        "type": "object",
        "required": ["data"],
        "properties": {
            "event": {"type": "string"},
            "data": {"anyOf": [{"const": "[DONE]"}, payload]} if done else payload,
        },
    }


def _one_of(types: tuple[Any, ...], schemas: Mapping[Any, dict[str, Any]]) -> dict[str, Any]:
    return schemas[types[0]] if len(types) == 1 else {"anyOf": [schemas[t] for t in types]}


def _content(reply: Reply, schemas: Mapping[Any, dict[str, Any]]) -> dict[str, Any]:
    content: dict[str, Any] = {}
    if reply.json:
        content[JSON] = {"schema": _one_of(reply.json, schemas)}
    if reply.sse:
        content[SSE] = {"schema": _event_stream(_one_of(reply.sse, schemas), reply.done)}
    if reply.text is not None:
        content[reply.text] = {"schema": {"type": "string"}}
    return content


def _operation(
    operation: Operation, generated: Mapping[str, Any], schemas: Mapping[Any, Any]
) -> dict[str, Any]:
    out = dict(generated)
    if operation.request is not None:
        out["requestBody"] = {"required": True, "content": {JSON: {"schema": schemas[operation.request]}}}
    if operation.parameters:
        given = {p["name"]: p for p in operation.parameters}
        kept = [p for p in out.get("parameters", []) if p["name"] not in given]
        out["parameters"] = [*kept, *operation.parameters]
    out["responses"] = {
        str(status): {
            "description": reply.description,
            "headers": {**REQUEST_ID, **reply.headers},
            "content": _content(reply, schemas),
        }
        for status, reply in sorted(operation.replies.items())
    }
    if operation.security:
        required: list[dict[str, list[str]]] = [{name: []} for name in operation.security]
        out["security"] = required if operation.required_security else [*required, {}]
    return out


def complete(document: Mapping[str, Any]) -> dict[str, Any]:
    """``document`` (litestar's, as a dict) with every operation of :data:`OPERATIONS` given its
    bodies and statuses; a new dict. Raises ``LookupError`` when an operation is not in the document
    (a handler moved) and ``ValueError`` when a component name would mean two schemas."""
    out = copy.deepcopy(dict(document))
    types = list(dict.fromkeys(t for operation in OPERATIONS.values() for t in operation.types()))
    generated, components = msgspec.json.schema_components(types, ref_template=REF)
    schemas = dict(zip(types, generated, strict=True))
    existing = out.setdefault("components", {}).setdefault("schemas", {})
    for name, schema in components.items():
        if existing.setdefault(name, schema) != schema:
            raise ValueError(f"two schemas named {name!r} in the OpenAPI document")
    out["components"].setdefault("securitySchemes", {}).update(SECURITY_SCHEMES)
    for (method, path), operation in OPERATIONS.items():
        try:
            generated_operation = out["paths"][path][method]
        except KeyError:
            raise LookupError(f"{method.upper()} {path} is documented but not served") from None
        out["paths"][path][method] = _operation(operation, generated_operation, schemas)
    return out


class SchemaDocument(JsonRenderPlugin):
    """Serves :func:`complete` of litestar's document, built on the first request and kept."""

    def __init__(self) -> None:
        super().__init__(path=SCHEMA_FILE)
        self._rendered: bytes | None = None

    def render(self, request: Request[Any, Any, Any], openapi_schema: dict[str, Any]) -> bytes:
        if self._rendered is None:
            self._rendered = msgspec.json.encode(complete(openapi_schema))
        return self._rendered


def openapi_config(version: str) -> OpenAPIConfig:
    """The gateway's OpenAPI configuration: ``/schema/openapi.json``, handler docstrings as
    descriptions."""
    return OpenAPIConfig(
        title="turnout",
        version=version,
        description="Routing inference gateway: the agents' APIs under /v1 (OpenAI chat completions and "
        "completions, Anthropic Messages, OpenAI Responses; bodies relayed from the engines), /health, "
        "/metrics, and the admin API under /admin/api (Authorization: Bearer <admin token>; see "
        "docs/dashboard.md).",
        path=SCHEMA_PATH,
        use_handler_docstrings=True,
        render_plugins=[SchemaDocument()],
    )
