"""The model catalog: client-facing names and aliases, and the deployments behind them."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from gateway.errors import ModelNotFound
from gateway.settings import ModelConfig
from policies.types import BackendSnapshot, Deployment


@dataclass(frozen=True, slots=True)
class CatalogModel:
    name: str
    aliases: tuple[str, ...]
    chars_per_token: float
    deployments: tuple[Deployment, ...]


class Catalog:
    """Resolves a requested name (or alias) to its model; lists models for ``/v1/models``."""

    def __init__(self, models: Sequence[ModelConfig], created: int) -> None:
        self.models = tuple(
            CatalogModel(
                name=m.name,
                aliases=m.aliases,
                chars_per_token=m.chars_per_token,
                deployments=tuple(
                    Deployment(
                        model=m.name,
                        backend_id=d.backend,
                        upstream_name=d.upstream_name,
                        context_window=d.context_window,
                        architecture=m.architecture,
                        quantization=d.quantization,
                        params_total_b=m.params_total_b,
                        params_active_b=m.params_active_b,
                    )
                    for d in m.deployments
                ),
            )
            for m in models
        )
        self._by_name = {name: model for model in self.models for name in (model.name, *model.aliases)}
        self.created = created

    def resolve(self, requested: str) -> CatalogModel:
        model = self._by_name.get(requested)
        if model is None:
            valid = ", ".join(sorted(self._by_name)) or "none configured"
            raise ModelNotFound(
                f"The model `{requested}` does not exist. Valid models: {valid}.", param="model"
            )
        return model

    def deployments_on(self, backend_id: str) -> tuple[Deployment, ...]:
        return tuple(d for m in self.models for d in m.deployments if d.backend_id == backend_id)

    def listing(self, snapshots: Sequence[BackendSnapshot]) -> dict[str, Any]:
        """The ``/v1/models`` body: each model, its largest live context window and its backends."""
        live = {d.model + "\0" + d.backend_id: d for s in snapshots for d in s.deployments}
        health = {s.backend_id: s.health.value for s in snapshots}
        data = []
        for model in self.models:
            deployments = [live.get(d.model + "\0" + d.backend_id, d) for d in model.deployments]
            windows = [d.context_window for d in deployments if d.context_window is not None]
            data.append(
                {
                    "id": model.name,
                    "object": "model",
                    "created": self.created,
                    "owned_by": "turnout",
                    "aliases": list(model.aliases),
                    "context_window": max(windows) if windows else None,
                    "backends": [
                        {
                            "id": d.backend_id,
                            "upstream_name": d.upstream_name,
                            "context_window": d.context_window,
                            "health": health.get(d.backend_id, "unknown"),
                        }
                        for d in deployments
                    ],
                }
            )
        return {"object": "list", "data": data}
