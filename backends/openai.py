"""Adapter for any other OpenAI-compatible server: relay as is, probe ``/v1/models`` only."""

from __future__ import annotations

from typing import ClassVar

from backends.base import Adapter
from policies.types import BackendSnapshot, EngineKind


class OpenAICompatAdapter(Adapter):
    """A server known only by its OpenAI API: no load signals, no engine-specific rewrites."""

    kind: ClassVar[EngineKind] = EngineKind.OPENAI

    async def probe_engine(self, base: BackendSnapshot) -> BackendSnapshot:
        return base
