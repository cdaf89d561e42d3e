"""The OpenAPI document: litestar's routes with turnout's bodies, statuses and error shapes laid in."""

from __future__ import annotations

import json
from typing import Any

import jsonschema
import pytest

from gateway.api import anthropic, openai
from gateway.api.document import OPERATIONS, complete
from gateway.app import create_app
from gateway.errors import ContextLengthExceeded, ModelNotFound, PayloadTooLarge, UpstreamFailed
from tests.e2e.conftest import stack_settings

V1_POSTS = [(m, p) for m, p in OPERATIONS if p.startswith("/v1/") and m == "post"]


@pytest.fixture(scope="module")
def document() -> dict[str, Any]:
    app = create_app(stack_settings({"vllm": "http://127.0.0.1:9", "llama": "http://127.0.0.1:9"}))
    return complete(app.openapi_schema.to_schema())


def resolve(document: dict[str, Any], schema: dict[str, Any]) -> dict[str, Any]:
    """``schema`` with the document's components, for jsonschema."""
    return {**schema, "components": document["components"]}


def test_every_route_litestar_documents_is_described(document: dict[str, Any]) -> None:
    generated = {(m, p) for p, item in document["paths"].items() for m in item}
    assert generated == set(OPERATIONS)


@pytest.mark.parametrize(("method", "path"), V1_POSTS)
def test_the_agents_endpoints_have_bodies_and_no_500(
    document: dict[str, Any], method: str, path: str
) -> None:
    operation = document["paths"][path][method]
    assert operation["requestBody"]["content"]["application/json"]["schema"]["$ref"]
    assert {"200", "400", "401", "404", "413", "429", "502", "503"} <= set(operation["responses"])
    assert "500" not in operation["responses"]


@pytest.mark.parametrize(
    "error",
    [
        ModelNotFound("no such model", param="model"),
        PayloadTooLarge("too large"),
        UpstreamFailed("backend vllm answered 500"),
        ContextLengthExceeded("too long", param="messages", prompt_tokens=9000, window=8192),
    ],
    ids=lambda e: type(e).__name__,
)
def test_the_errors_turnout_writes_match_their_schema(document: dict[str, Any], error: Any) -> None:
    """Each API's error body, as the gateway writes it, is the one the document promises."""
    for path, body in (
        ("/v1/chat/completions", error.openai_body()),
        ("/v1/messages", error.anthropic_body()),
    ):
        schema = document["paths"][path]["post"]["responses"][str(error.status)]["content"][
            "application/json"
        ]
        jsonschema.validate(json.loads(body), resolve(document, schema["schema"]))


def test_streams_are_documented_event_by_event(document: dict[str, Any]) -> None:
    """``text/event-stream``: each event's data is a JSON text of the chunk (or an error), or [DONE]."""
    ok = document["paths"]["/v1/chat/completions"]["post"]["responses"]["200"]["content"]
    data = ok["text/event-stream"]["schema"]["properties"]["data"]
    assert {"const": "[DONE]"} in data["anyOf"]
    payload = next(d for d in data["anyOf"] if "contentSchema" in d)
    refs = {s["$ref"] for s in payload["contentSchema"]["anyOf"]}
    assert refs == {"#/components/schemas/ChatCompletionChunk", "#/components/schemas/OpenAIError"}
    assert ok["application/json"]["schema"] == {"$ref": "#/components/schemas/ChatCompletion"}


def test_an_operation_nobody_serves_is_an_error() -> None:
    with pytest.raises(LookupError, match="documented but not served"):
        complete({"paths": {}})


def test_error_bodies_are_the_api_models() -> None:
    assert openai.error_body("m", "t") == b'{"error":{"message":"m","type":"t","param":null,"code":null}}'
    assert anthropic.error_body(413, "m") == (
        b'{"type":"error","error":{"type":"request_too_large","message":"m"}}'
    )
    assert b'"api_error"' in anthropic.error_body(502, "m")
