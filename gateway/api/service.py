"""turnout's own bodies: the model list in OpenAI's and Anthropic's shapes (``gateway.model_api``),
``/health``, and the admin API's envelopes."""

from __future__ import annotations

from typing import Annotated, Any, Literal

from msgspec import Meta, Struct

BackendHealth = Literal["unknown", "loading", "ready", "down"]


class ModelBackend(Struct):
    id: str
    upstream_name: str
    context_window: Annotated[int, Meta(description="as configured; the engine's own may be smaller")] | None
    health: BackendHealth


class Model(Struct):
    """OpenAI's model object, with turnout's windows beside the standard fields."""

    id: str
    object: Literal["model"]
    created: int
    owned_by: str
    aliases: list[str]
    context_window: (
        Annotated[int, Meta(description="the largest window the model can be routed to now")] | None
    )
    max_output_tokens: int
    backends: list[ModelBackend]


class ModelList(Struct):
    object: Literal["list"]
    data: list[Model]
    models: (
        Annotated[list[dict[str, Any]], Meta(description="Codex's model catalog, with ?client_version=")]
        | None
    ) = None


class AnthropicModel(Struct):
    """Anthropic's ``ModelInfo``, for clients that send ``anthropic-version``."""

    type: Literal["model"]
    id: str
    display_name: str
    created_at: Annotated[str, Meta(extra_json_schema={"format": "date-time"})]
    lifecycle: str
    max_input_tokens: int | None
    max_tokens: int
    capabilities: dict[str, Any] | None = None
    line: str | None = None
    deprecated_at: str | None = None
    retires_at: str | None = None


class AnthropicModelPage(Struct):
    data: list[AnthropicModel]
    first_id: str | None
    last_id: str | None
    has_more: bool


class Health(Struct):
    """200 while at least one backend is ready (or not probed yet), else 503; 503 ``draining`` while
    the gateway shuts down."""

    status: Literal["ok", "unavailable", "draining"]
    backends: dict[str, BackendHealth]
    state: Annotated[
        Literal["memory", "ok", "degraded"],
        Meta(description="the shared state: memory (no Redis), ok, or degraded (Redis away)"),
    ]
    circuits: Annotated[
        dict[str, Literal["closed", "open", "half-open"]],
        Meta(description="each backend's circuit breaker (docs/reliability.md)"),
    ]
    warnings: dict[str, list[str]] = {}
    residency: Annotated[
        dict[str, dict[str, Any]],
        Meta(
            description="per residency set: the member awake, the phase, the last switch (docs/residency.md)"
        ),
    ] = {}


class AdminList(Struct):
    object: Literal["list"]
    data: list[dict[str, Any]]


class AdminProfile(Struct):
    profile: str


class AdminPin(Struct):
    member: str


class AdminWake(Struct, forbid_unknown_fields=True):
    """A residency switch (``POST /admin/api/residency/{set}``): the member to give the GPUs to."""

    wake: str


class WhatIfEdits(Struct, forbid_unknown_fields=True):
    """A what-if (``POST /admin/api/whatif``): the recording's last ``minutes`` replayed on this
    gateway's fleet with these changes."""

    minutes: Annotated[int, Meta(description="the recording's last minutes (1 to 1,440)")] = 60
    model: Annotated[
        str | None, Meta(description="replay every request as this model; unset: the most asked-for")
    ] = None
    remove: Annotated[list[str], Meta(description="backends left out")] = []
    copies: Annotated[list[str], Meta(description="backends to add a copy of (`<id>-copy`, ...)")] = []
    slots: Annotated[dict[str, int], Meta(description="llama.cpp backend -> its slots")] = {}
    windows: Annotated[dict[str, int], Meta(description="backend -> the window of its deployments")] = {}


class AdminErrorDetail(Struct):
    message: str
    type: str


class AdminError(Struct):
    """The admin API's errors (and the guard's 401, in OpenAI's shape: the same plus ``param`` and
    ``code``)."""

    error: AdminErrorDetail
