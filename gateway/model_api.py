"""``GET /v1/models`` and ``GET /v1/models/{id}`` in the shape of the API the client speaks.

A client that sends ``anthropic-version`` (Claude Code, the anthropic SDKs) gets Anthropic's model
objects, everyone else OpenAI's; Codex (``?client_version=``) gets its own catalog beside OpenAI's list
(``gateway.agents.codex``). Both carry the window that matters to an agent: the largest one the
model can be routed to now (``Catalog.window``). Anthropic's object has it as ``max_input_tokens`` and
the longest reply as ``max_tokens`` (the anthropic SDK's ``ModelInfo``); OpenAI's object has no field for
it, so turnout adds ``context_window`` and ``max_output_tokens`` beside the standard ones, plus each
backend's own window and health.
"""

from __future__ import annotations

import datetime as dt
from collections.abc import Mapping, Sequence
from typing import Any

from gateway.agents.codex import CODEX_QUERY, codex_model
from gateway.catalog import Catalog, CatalogModel, max_output_tokens
from gateway.errors import InvalidRequest
from policies.types import BackendSnapshot

ANTHROPIC_PAGE = 20
ANTHROPIC_PAGE_MAX = 1000


def speaks_anthropic(headers: Mapping[str, str]) -> bool:
    return "anthropic-version" in headers


def openai_model(
    catalog: Catalog, model: CatalogModel, snapshots: Sequence[BackendSnapshot], name: str | None = None
) -> dict[str, Any]:
    """OpenAI's model object (``id``, ``object``, ``created``, ``owned_by``) and turnout's windows."""
    window = catalog.window(model, snapshots)
    return {
        "id": name or model.name,
        "object": "model",
        "created": catalog.created,
        "owned_by": "turnout",
        "aliases": list(model.aliases),
        "context_window": window,
        "max_output_tokens": max_output_tokens(model, window),
        **({"members": list(model.members)} if model.members else {}),
        "backends": [
            {
                "id": d.backend_id,
                "upstream_name": d.upstream_name,
                "context_window": d.context_window,
                "health": health.value,
            }
            for d, health in catalog.deployments_live(model, snapshots)
        ],
    }


def anthropic_model(
    catalog: Catalog, model: CatalogModel, snapshots: Sequence[BackendSnapshot], name: str | None = None
) -> dict[str, Any]:
    """Anthropic's ``ModelInfo`` (anthropic SDK 2.14): ``type``, ``id``, ``display_name``, ``created_at``
    (RFC 3339), ``lifecycle``, ``max_input_tokens`` and ``max_tokens``; the optional ``capabilities``,
    ``line``, ``deprecated_at`` and ``retires_at`` are null (turnout cannot vouch for them)."""
    window = catalog.window(model, snapshots)
    created = dt.datetime.fromtimestamp(catalog.created, dt.UTC).strftime("%Y-%m-%dT%H:%M:%SZ")
    return {
        "type": "model",
        "id": name or model.name,
        "display_name": model.display_name or model.name,
        "created_at": created,
        "lifecycle": "active",
        "max_input_tokens": window,
        "max_tokens": max_output_tokens(model, window),
        "capabilities": None,
        "line": None,
        "deprecated_at": None,
        "retires_at": None,
    }


def openai_listing(
    catalog: Catalog, snapshots: Sequence[BackendSnapshot], query: Mapping[str, str]
) -> dict[str, Any]:
    """OpenAI's list; for Codex (``?client_version=``) also its catalog under ``models``."""
    body: dict[str, Any] = {
        "object": "list",
        "data": [openai_model(catalog, m, snapshots) for m in catalog.models],
    }
    if CODEX_QUERY in query:
        body["models"] = [
            codex_model(m.name, m.display_name or m.name, catalog.window(m, snapshots), priority)
            for priority, m in enumerate(catalog.models, start=1)
        ]
    return body


def anthropic_listing(
    catalog: Catalog, snapshots: Sequence[BackendSnapshot], query: Mapping[str, str]
) -> dict[str, Any]:
    """One page of Anthropic's model list (``after_id``, ``before_id``, ``limit`` 1-1000, default 20):
    ``data``, ``first_id``, ``last_id``, ``has_more``."""
    names = [m.name for m in catalog.models]
    try:
        limit = int(query.get("limit", ANTHROPIC_PAGE))
    except ValueError:
        raise InvalidRequest("limit: must be an integer", param="limit") from None
    if not 1 <= limit <= ANTHROPIC_PAGE_MAX:
        raise InvalidRequest(f"limit: must be between 1 and {ANTHROPIC_PAGE_MAX}", param="limit")
    start, end = 0, len(names)
    for key in ("after_id", "before_id"):
        if key in query and query[key] not in names:
            raise InvalidRequest(f"{key}: no model `{query[key]}`", param=key)
    if "after_id" in query:
        start = names.index(query["after_id"]) + 1
    if "before_id" in query:
        end = names.index(query["before_id"])
        start = max(start, end - limit)
    page = catalog.models[start:end][:limit]
    data = [anthropic_model(catalog, m, snapshots) for m in page]
    has_more = (start + len(page) < end) if "before_id" not in query else start > 0
    return {
        "data": data,
        "first_id": data[0]["id"] if data else None,
        "last_id": data[-1]["id"] if data else None,
        "has_more": has_more,
    }
