"""The adapter contract: prepare a request for one engine, send it, probe the engine.

All HTTP to engines goes through an adapter and one shared ``httpx.AsyncClient`` injected by the
caller; inference requests go through a ``Poster``, the gateway's being its aiohttp transport
(``backends.transport``: no httpx models on the request path). Adapters translate every transport
and status failure into :mod:`backends.errors`.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any, ClassVar, Protocol

import httpx
import msgspec
from msgspec.structs import replace

from backends.clock import WALL, Clock
from backends.errors import UpstreamStatusError, UpstreamUnavailable, parse_error_body
from backends.parsers.openai import ServedModel, parse_models
from backends.transport import UpstreamResponse
from policies.features import within_window
from policies.types import BackendSnapshot, Deployment, Endpoint, EngineKind, Health

UPSTREAM_PATHS: dict[Endpoint, str] = {
    Endpoint.CHAT: "/v1/chat/completions",
    Endpoint.COMPLETIONS: "/v1/completions",
    Endpoint.MESSAGES: "/v1/messages",
    Endpoint.COUNT_TOKENS: "/v1/messages/count_tokens",
    Endpoint.RESPONSES: "/v1/responses",
}


READ_BACKSTOP_S = 5.0


@dataclass(frozen=True, slots=True)
class BackendSpec:
    """What an adapter needs to know about its engine (built from the gateway's settings)."""

    id: str
    kind: EngineKind
    base_url: str
    api_key: str | None = None
    connect_timeout: float = 5.0
    read_timeout: float = 600.0
    """The longest wait for a first byte (a request queued or prefilling), and for any one read."""
    first_byte_timeout: float = 30.0
    """Silence before the first byte while the engine reports nothing running or queued: hung."""
    stream_idle_timeout: float = 60.0
    """Silence between two bytes once a stream has begun: stalled."""
    probe_timeout: float = 2.0
    probe_interval_s: float = 2.0
    circuit_failures: int = 3
    circuit_cool_down_s: float = 5.0
    circuit_max_cool_down_s: float = 60.0
    deployments: tuple[Deployment, ...] = ()
    router_model: str | None = None
    """llama-server in router mode: the model this backend is (its probes name it: ``?model=``)."""
    sleeps: bool = False
    """A member of a residency set (vLLM: its probe asks ``/is_sleeping``, asleep is down)."""


class UpstreamRequest(msgspec.Struct, frozen=True):
    """A request ready to send, and the rewrites its response needs on the way back."""

    backend_id: str
    url: str
    body: bytes
    stream: bool
    headers: tuple[tuple[str, str], ...] = ()
    strip_usage_chunk: bool = False
    """turnout asked for ``include_usage`` itself; the extra usage chunk is not the client's."""
    model_rename: tuple[bytes, bytes] | None = None
    """``(b'"model":"<upstream>"', b'"model":"<client>"')`` when the names differ."""
    anthropic_from_chat: str | None = None
    """Sent as chat completions for an Anthropic client: translate the answer back (client's model name)."""
    extra: Mapping[str, Any] = msgspec.field(default_factory=dict)


def model_rename(upstream: str, client: str) -> tuple[bytes, bytes] | None:
    if upstream == client:
        return None
    encode = msgspec.json.encode
    return b'"model":' + encode(upstream), b'"model":' + encode(client)


class Poster(Protocol):
    """Sends an inference request; fails with httpx's exceptions (``backends.transport``)."""

    async def post(
        self, url: str, content: bytes, headers: Sequence[tuple[str, str]], timeouts: httpx.Timeout
    ) -> UpstreamResponse: ...


class Documents(Protocol):
    """An engine's small endpoints answered in this process, without HTTP: ``(status, the decoded
    JSON or the text)`` of a GET (``payload`` None) or of a small JSON POST (token counts). A
    virtual-time replay probes the engine models this way (``backends.sim.inprocess``)."""

    def __call__(self, path: str, payload: Mapping[str, Any] | None = None) -> tuple[int, Any]: ...


class HttpxPoster:
    """A ``Poster`` over any ``httpx.AsyncClient``."""

    def __init__(self, client: httpx.AsyncClient) -> None:
        self.client = client

    async def post(
        self, url: str, content: bytes, headers: Sequence[tuple[str, str]], timeouts: httpx.Timeout
    ) -> httpx.Response:
        request = self.client.build_request("POST", url, content=content, headers=headers, timeout=timeouts)
        return await self.client.send(request, stream=True)


class Adapter(ABC):
    """One engine kind's knowledge: request rewrites, response parsing, probing."""

    kind: ClassVar[EngineKind]

    def __init__(
        self,
        spec: BackendSpec,
        client: httpx.AsyncClient,
        poster: Poster | None = None,
        clock: Clock = WALL,
        documents: Documents | None = None,
    ) -> None:
        self.spec = spec
        self.documents = documents
        """Where probes and token counts are answered instead of over HTTP (``Documents``)."""
        self.clock = clock
        """Stamps the probes' snapshots (``taken_at``)."""
        self.client = client
        self.poster = poster or HttpxPoster(client)
        self._auth: tuple[tuple[str, str], ...] = (
            (("authorization", f"Bearer {spec.api_key}"),) if spec.api_key else ()
        )
        # a backstop: the watchdog (backends.watchdog) ends a silent request first, saying why
        backstop = spec.read_timeout + READ_BACKSTOP_S
        self._timeout = httpx.Timeout(backstop, connect=spec.connect_timeout)
        self._stream_timeout = httpx.Timeout(
            connect=spec.connect_timeout, read=None, write=backstop, pool=backstop
        )
        """A stream is read under the watchdog from its headers to its last event (``gateway.relay``):
        no socket read timer, which aiohttp cancels and re-arms on every chunk it receives."""
        self._probe_timeout = httpx.Timeout(spec.probe_timeout)

    # -- requests ---------------------------------------------------------------------------
    def rewrite_body(
        self, endpoint: Endpoint, body: dict[str, Any], deployment: Deployment, slot: int | None
    ) -> bool:
        """Engine-specific changes to the upstream body (in place); returns ``strip_usage_chunk``."""
        return False

    def prepare(
        self,
        endpoint: Endpoint,
        body: Mapping[str, Any],
        deployment: Deployment,
        client_model: str,
        slot: int | None = None,
    ) -> UpstreamRequest:
        """The upstream request: the client's body with the model mapped and the engine's rewrites."""
        upstream = dict(body)
        upstream["model"] = deployment.upstream_name
        upstream.update(within_window(body, endpoint, deployment.context_window))
        strip = self.rewrite_body(endpoint, upstream, deployment, slot)
        stream = bool(upstream.get("stream", False))
        return UpstreamRequest(
            backend_id=self.spec.id,
            url=self.spec.base_url + UPSTREAM_PATHS[endpoint],
            body=msgspec.json.encode(upstream),
            stream=stream,
            headers=(("content-type", "application/json"), *self._auth, *self._api_headers(endpoint)),
            strip_usage_chunk=strip,
            model_rename=model_rename(deployment.upstream_name, client_model),
        )

    def _api_headers(self, endpoint: Endpoint) -> tuple[tuple[str, str], ...]:
        """Anthropic endpoints expect an API version header; engines accept the current one."""
        return (("anthropic-version", "2023-06-01"),) if endpoint.anthropic else ()

    async def send(self, request: UpstreamRequest) -> UpstreamResponse:
        """Send and return the open response once its status is 2xx (the body is not read yet).

        Raises :class:`UpstreamUnavailable` when there is no answer, :class:`UpstreamStatusError`
        for an error status (its body read and normalised).
        """
        try:
            timeout = self._stream_timeout if request.stream else self._timeout
            response = await self.poster.post(request.url, request.body, request.headers, timeout)
        except httpx.TimeoutException as exc:
            raise UpstreamUnavailable(self.spec.id, f"timed out: {type(exc).__name__}") from exc
        except httpx.TransportError as exc:
            raise UpstreamUnavailable(self.spec.id, f"unreachable: {type(exc).__name__}") from exc
        if response.status_code >= 400:
            try:
                body = await response.aread()
            except httpx.HTTPError:
                body = b""
            finally:
                await response.aclose()
            raise parse_error_body(self.spec.id, response.status_code, body)
        return response

    async def count_tokens(
        self, endpoint: Endpoint, body: Mapping[str, Any], deployment: Deployment
    ) -> int | None:
        """The exact prompt token count by the engine's own tokenizer, or None where it cannot say."""
        return None

    async def _post_json(self, path: str, payload: Mapping[str, Any]) -> Any:
        """POST a small JSON request (counting, templating) with the probe timeout; None on any failure."""
        if self.documents is not None:
            status, data = self.documents(path, payload)
            return None if status >= 400 else data
        try:
            response = await self.client.post(
                self.spec.base_url + path,
                content=msgspec.json.encode(payload),
                headers=dict((("content-type", "application/json"), *self._auth)),
                timeout=self._probe_timeout,
            )
            if response.status_code >= 400:
                return None
            return msgspec.json.decode(response.content)
        except (httpx.HTTPError, msgspec.DecodeError):
            return None

    # -- probes -----------------------------------------------------------------------------
    async def _get(self, path: str) -> tuple[int, Any]:
        """GET a probe path; returns (status, decoded JSON or text)."""
        if self.documents is not None:
            return self.documents(path)
        response = await self.client.get(
            self.spec.base_url + path, headers=dict(self._auth), timeout=self._probe_timeout
        )
        content = response.content
        if response.headers.get("content-type", "").startswith("application/json") and content:
            try:
                return response.status_code, msgspec.json.decode(content)
            except msgspec.DecodeError:
                return response.status_code, content.decode("utf-8", "replace")
        return response.status_code, content.decode("utf-8", "replace")

    async def _get_ok(self, path: str) -> Any:
        status, data = await self._get(path)
        if status >= 400:
            raise UpstreamStatusError(self.spec.id, status, f"GET {path} answered {status}")
        return data

    async def probe_models(self) -> tuple[ServedModel, ...]:
        return parse_models(await self._get_ok("/v1/models"))

    @abstractmethod
    async def probe_engine(self, base: BackendSnapshot) -> BackendSnapshot:
        """Engine-specific probing on top of a ready snapshot (load, slots, cache counters)."""

    async def probe(self) -> BackendSnapshot:
        """One probe: health, models and load, as an immutable snapshot. Never raises."""
        base = BackendSnapshot(
            self.spec.id, self.kind, Health.UNKNOWN, self.clock.time(), self.spec.deployments
        )
        try:
            status, content = await self._health()
            if status >= 400:
                error = parse_error_body(self.spec.id, status, content)
                return replace(base, health=self.health_for_status(error), error=error.message)
            served = await self.probe_models()
            snapshot = replace(
                base,
                health=Health.READY,
                served_names=tuple(m.id for m in served),
                deployments=self._with_windows(served),
            )
            return await self.probe_engine(snapshot)
        except UpstreamStatusError as exc:
            return replace(base, health=self.health_for_status(exc), error=exc.message)
        except (httpx.HTTPError, ValueError, msgspec.DecodeError) as exc:
            return replace(base, health=Health.DOWN, error=f"{type(exc).__name__}: {exc}"[:200])

    async def _health(self) -> tuple[int, bytes]:
        """``GET /health``: its status and raw body (an error body is parsed as the engine wrote it)."""
        if self.documents is not None:
            status, data = self.documents("/health")
            return status, msgspec.json.encode(data)
        response = await self.client.get(
            self.spec.base_url + "/health", headers=dict(self._auth), timeout=self._probe_timeout
        )
        return response.status_code, response.content

    def health_for_status(self, error: UpstreamStatusError) -> Health:
        return Health.DOWN

    def _with_windows(self, served: tuple[ServedModel, ...]) -> tuple[Deployment, ...]:
        """Deployments with the context window the engine reports, where it is smaller."""
        windows = {m.id: m.context_window for m in served}
        updated = []
        for deployment in self.spec.deployments:
            reported = windows.get(deployment.upstream_name)
            configured = deployment.context_window
            if reported is not None and (configured is None or reported < configured):
                deployment = replace(deployment, context_window=reported)
            updated.append(deployment)
        return tuple(updated)
