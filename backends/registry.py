"""Adapter classes by engine kind."""

from __future__ import annotations

import httpx

from backends.base import Adapter, BackendSpec, Documents, Poster
from backends.clock import WALL, Clock
from backends.llamacpp import LlamaCppAdapter
from backends.openai import OpenAICompatAdapter
from backends.vllm import VllmAdapter
from policies.types import EngineKind

ADAPTERS: dict[EngineKind, type[Adapter]] = {
    EngineKind.VLLM: VllmAdapter,
    EngineKind.LLAMACPP: LlamaCppAdapter,
    EngineKind.OPENAI: OpenAICompatAdapter,
}


def create_adapter(
    spec: BackendSpec,
    client: httpx.AsyncClient,
    poster: Poster | None = None,
    clock: Clock = WALL,
    documents: Documents | None = None,
) -> Adapter:
    return ADAPTERS[spec.kind](spec, client, poster, clock, documents)
