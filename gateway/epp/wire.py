"""The Endpoint Picker protocol's names and the Envoy ext_proc messages turnout sends, built here
only (kubernetes-sigs/gateway-api-inference-extension, docs/proposals/004-endpoint-picker-protocol,
v1.0.0; the reference picker's ordering is llm-d/llm-d-router's ``pkg/epp/handlers``).

- The chosen endpoint (``ip:port``) goes in the request header ``x-gateway-destination-endpoint``
  and, with the same value, in the dynamic metadata ``envoy.lb``; fallbacks, when asked for, follow
  it comma-separated in both (stock Envoy's ORIGINAL_DST cluster reads one endpoint only).
- The data plane may narrow the pool: ``envoy.lb.subset_hint`` /
  ``x-gateway-destination-endpoint-subset`` in the request's metadata, a list of ``ip:port`` (or a
  comma-separated string); present and empty, nothing fits (503).
- The endpoint that really served the request comes back as ``envoy.lb`` /
  ``x-gateway-destination-endpoint-served`` (stock Envoy does not set it: the pick stands).
- In FULL_DUPLEX_STREAMED body mode the picker answers the request headers once it has read the
  whole body (Envoy holds the request till then), then sends the body back as streamed chunks of at
  most ``CHUNK`` bytes, the last with ``end_of_stream``; headers, body, trailers, in that order.
- In BUFFERED mode Envoy waits for the answer to the headers before it sends the whole body in one
  message: the headers go on unchanged, and the answer to the body carries the destination (a
  header mutation, still possible while Envoy holds the headers) and the body to send.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator, Mapping, Sequence
from typing import Any
from urllib.parse import urlsplit

from envoy.config.core.v3 import base_pb2
from envoy.extensions.filters.http.ext_proc.v3 import processing_mode_pb2
from envoy.service.ext_proc.v3 import external_processor_pb2 as pb
from envoy.type.v3 import http_status_pb2
from google.protobuf import struct_pb2

DESTINATION = "x-gateway-destination-endpoint"
DESTINATION_NAMESPACE = "envoy.lb"
SUBSET_NAMESPACE = "envoy.lb.subset_hint"
SUBSET = "x-gateway-destination-endpoint-subset"
SERVED = "x-gateway-destination-endpoint-served"
MAX_RETRIES = "x-envoy-max-retries"
"""How many of the named fallbacks Envoy may try (``gateway.epp.fallbacks``)."""
EXT_PROC_SERVICE = "envoy.service.ext_proc.v3.ExternalProcessor"
HEALTH_SERVICES = ("", "liveness", "readiness", EXT_PROC_SERVICE)
"""The gRPC health services a picker answers (``""`` is readiness, as the reference's)."""
CHUNK = 62_000
"""Body bytes per streamed reply (the reference's; Envoy recommends at most 64 KiB)."""
BODY_PHASES = ("request_body", "response_body")
Mode = processing_mode_pb2.ProcessingMode.BodySendMode
STREAMED_MODE = Mode.FULL_DUPLEX_STREAMED
BUFFERED_MODE = Mode.BUFFERED
"""The two body modes a picker serves: the protocol's streaming one, and Envoy's whole-body one."""


def header_map(headers: Any) -> dict[str, str]:
    """An ext_proc ``HttpHeaders``' header map as a dict (names lowercased; ``raw_value`` first)."""
    out: dict[str, str] = {}
    for header in headers.headers.headers:
        value = header.raw_value.decode("utf-8", "replace") if header.raw_value else header.value
        out[header.key.lower()] = value
    return out


def _header(name: str, value: str) -> Any:
    return base_pb2.HeaderValueOption(header=base_pb2.HeaderValue(key=name, raw_value=value.encode()))


def _destination(endpoints: Sequence[str]) -> tuple[str, Any]:
    """The destination's value (the endpoints, comma-separated) and the ``envoy.lb`` metadata holding it."""
    destination = ",".join(endpoints)
    metadata = struct_pb2.Struct()
    metadata.update({DESTINATION_NAMESPACE: {DESTINATION: destination}})
    return destination, metadata


def route(endpoints: Sequence[str], headers: Mapping[str, str], remove: Iterable[str] = ()) -> Any:
    """The answer to the request headers: go to ``endpoints`` (the first, then the fallbacks), with
    ``headers`` set (the upstream path, its auth) and ``remove`` removed; the route is picked again."""
    destination, metadata = _destination(endpoints)
    mutation = pb.HeaderMutation(
        set_headers=[_header(DESTINATION, destination), *(_header(k, v) for k, v in headers.items())],
        remove_headers=list(remove),
    )
    common = pb.CommonResponse(clear_route_cache=True, header_mutation=mutation)
    return pb.ProcessingResponse(
        request_headers=pb.HeadersResponse(response=common), dynamic_metadata=metadata
    )


def route_buffered(endpoints: Sequence[str], headers: Mapping[str, str], content: bytes) -> Any:
    """BUFFERED mode's answer to the whole request body: go to ``endpoints`` with ``headers`` set
    (its length among them) and ``content`` as the body; the route is picked again."""
    destination, metadata = _destination(endpoints)
    mutation = pb.HeaderMutation(
        set_headers=[
            _header(DESTINATION, destination),
            _header("content-length", str(len(content))),
            *(_header(k, v) for k, v in headers.items()),
        ]
    )
    common = pb.CommonResponse(
        clear_route_cache=True, header_mutation=mutation, body_mutation=pb.BodyMutation(body=content)
    )
    return pb.ProcessingResponse(request_body=pb.BodyResponse(response=common), dynamic_metadata=metadata)


def go_on(phase: str) -> Any:
    """Let ``phase`` (headers or a buffered body) through unchanged."""
    answer = pb.HeadersResponse() if phase.endswith("headers") else pb.BodyResponse()
    return pb.ProcessingResponse(**{phase: answer})


def whole_body(phase: str, data: bytes) -> Any:
    """BUFFERED mode's answer to a whole body: ``data`` instead."""
    common = pb.CommonResponse(body_mutation=pb.BodyMutation(body=data))
    return pb.ProcessingResponse(**{phase: pb.BodyResponse(response=common)})


def response_headers(headers: Mapping[str, str], remove: Iterable[str] = ()) -> Any:
    """The answer to the response headers: ``headers`` added (the decision's), ``remove`` removed."""
    mutation = pb.HeaderMutation(
        set_headers=[_header(k, v) for k, v in headers.items()], remove_headers=list(remove)
    )
    common = pb.CommonResponse(header_mutation=mutation)
    return pb.ProcessingResponse(response_headers=pb.HeadersResponse(response=common))


def body(phase: str, data: bytes, end: bool) -> Iterator[Any]:
    """``data`` as streamed body replies of ``phase`` (request_body or response_body), at most
    ``CHUNK`` bytes each; ``end``: the last one ends the body (an empty body is one empty reply)."""
    assert phase in BODY_PHASES
    starts = range(0, len(data), CHUNK) if data else (0,)
    last = starts[-1]
    for start in starts:
        streamed = pb.StreamedBodyResponse(
            body=data[start : start + CHUNK], end_of_stream=end and start == last
        )
        common = pb.CommonResponse(body_mutation=pb.BodyMutation(streamed_response=streamed))
        yield pb.ProcessingResponse(**{phase: pb.BodyResponse(response=common)})


def trailers(phase: str) -> Any:
    """The answer to trailers (nothing changed)."""
    return pb.ProcessingResponse(**{phase: pb.TrailersResponse()})


def immediate(
    status: int,
    content: bytes,
    headers: Mapping[str, str] | None = None,
    content_type: str = "application/json",
) -> Any:
    """Answer the client now, without an upstream (an error: 4xx, 429 shed, 503 nothing fits), with
    ``headers`` (a 429's ``retry-after``)."""
    extra = (_header(k, v) for k, v in (headers or {}).items())
    mutation = pb.HeaderMutation(set_headers=[_header("content-type", content_type), *extra])
    return pb.ProcessingResponse(
        immediate_response=pb.ImmediateResponse(
            status=http_status_pb2.HttpStatus(code=status), body=content, headers=mutation
        )
    )


def _metadata_value(request: Any, namespace: str, key: str) -> Any:
    """The value at ``namespace`` / ``key`` of the request's metadata (None when absent)."""
    spaces = request.metadata_context.filter_metadata
    if namespace not in spaces:
        return None
    fields = spaces[namespace].fields
    return fields.get(key)


def subset_hint(request: Any) -> frozenset[str] | None:
    """The endpoints the data plane allows (``ip:port`` or bare ``ip``), None when it set no hint."""
    value = _metadata_value(request, SUBSET_NAMESPACE, SUBSET)
    if value is None:
        return None
    kind = value.WhichOneof("kind")
    if kind == "list_value":
        items = [v.string_value for v in value.list_value.values if v.WhichOneof("kind") == "string_value"]
    elif kind == "string_value":
        items = value.string_value.split(",")
    else:
        items = []
    return frozenset(item.strip() for item in items if item.strip())


def served(request: Any) -> str | None:
    """The endpoint the data plane says served the request (None: it does not say)."""
    value = _metadata_value(request, DESTINATION_NAMESPACE, SERVED)
    return value.string_value or None if value is not None else None


def allowed(endpoint: str, subset: frozenset[str]) -> bool:
    """Whether ``endpoint`` (``ip:port``) is in ``subset``: by ``ip:port``, or by ``ip`` alone."""
    return endpoint in subset or endpoint.rsplit(":", 1)[0] in subset


def endpoint_address(base_url: str) -> str:
    """A backend's ``ip:port`` for Envoy's ORIGINAL_DST cluster (the URL's own port, else the scheme's)."""
    url = urlsplit(base_url)
    port = url.port or (443 if url.scheme == "https" else 80)
    return f"{url.hostname}:{port}"
