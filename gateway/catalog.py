"""The model catalog: client-facing names and aliases, and the deployments behind them."""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass

from gateway.errors import ModelNotFound
from gateway.settings import GroupConfig, ModelConfig
from policies.engine_profile import EngineProfile
from policies.types import BackendSnapshot, Deployment, Health

ROUTABLE = frozenset({Health.READY, Health.UNKNOWN})
"""Backends the ``healthy`` filter lets requests through to."""
DEFAULT_MAX_OUTPUT = 32_000


@dataclass(frozen=True, slots=True)
class CatalogModel:
    name: str
    aliases: tuple[str, ...]
    chars_per_token: float
    deployments: tuple[Deployment, ...]
    max_output_tokens: int | None = None
    display_name: str | None = None
    members: tuple[str, ...] = ()
    """A model group's member models, the default first (``deployments``: all of theirs); empty for
    a plain model."""
    reasoning_floor_b: float | None = None
    """A group's size floor for requests asking for deep reasoning (``GroupConfig.reasoning_floor_b``)."""
    prefer_default: float = 0.0
    """A group's preference for its default member (``GroupConfig.prefer_default``)."""


class Catalog:
    """Resolves a requested name (or alias) to its model; knows each model's windows."""

    def __init__(
        self,
        models: Sequence[ModelConfig],
        created: int,
        profiles: Mapping[str, EngineProfile] | None = None,
        groups: Sequence[GroupConfig] = (),
    ) -> None:
        """``profiles``: each backend's engine profile, by backend id (``Settings.engine_profiles``);
        ``groups``: model groups over ``models`` (listed after them)."""
        profiles = profiles or {}
        self.models = tuple(
            CatalogModel(
                name=m.name,
                aliases=m.aliases,
                chars_per_token=m.chars_per_token,
                max_output_tokens=m.max_output_tokens,
                display_name=m.display_name,
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
                        profile=profiles.get(d.backend),
                    )
                    for d in m.deployments
                ),
            )
            for m in models
        )
        plain = {m.name: m for m in self.models}
        self.models += tuple(
            CatalogModel(
                name=g.name,
                aliases=g.aliases,
                chars_per_token=plain[g.ordered[0]].chars_per_token,
                deployments=tuple(d for member in g.ordered for d in plain[member].deployments),
                max_output_tokens=g.max_output_tokens
                or _smallest(plain[m].max_output_tokens for m in g.members),
                display_name=g.display_name,
                members=g.ordered,
                reasoning_floor_b=g.reasoning_floor_b,
                prefer_default=g.prefer_default,
            )
            for g in groups
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

    def visible(self, allowed: Callable[[str], bool]) -> Catalog:
        """The catalog as a key sees it: only the models ``allowed`` (by name)."""
        view = Catalog((), self.created)
        view.models = tuple(m for m in self.models if allowed(m.name))
        view._by_name = {n: m for n, m in self._by_name.items() if allowed(m.name)}
        return view

    def deployments_on(self, backend_id: str) -> tuple[Deployment, ...]:
        return tuple(
            d for m in self.models if not m.members for d in m.deployments if d.backend_id == backend_id
        )

    def window(self, model: CatalogModel, snapshots: Sequence[BackendSnapshot]) -> int | None:
        """The largest context window ``model`` can be routed to now: over its deployments on
        backends that take requests (ready, or not probed yet), each as the engine reports it; when
        none does, over all of them (what it will be once they are back)."""
        live = {(d.model, d.backend_id): d for s in snapshots for d in s.deployments}
        routable = {s.backend_id for s in snapshots if s.health in ROUTABLE}
        deployments = [live.get((d.model, d.backend_id), d) for d in model.deployments]
        now = [d.context_window for d in deployments if d.backend_id in routable and d.context_window]
        known = [d.context_window for d in deployments if d.context_window]
        return max(now or known) if (now or known) else None

    def deployments_live(
        self, model: CatalogModel, snapshots: Sequence[BackendSnapshot]
    ) -> list[tuple[Deployment, Health]]:
        """Each deployment of ``model`` as its backend last reported it, with the backend's health."""
        live = {(d.model, d.backend_id): d for s in snapshots for d in s.deployments}
        health = {s.backend_id: s.health for s in snapshots}
        return [
            (live.get((d.model, d.backend_id), d), health.get(d.backend_id, Health.UNKNOWN))
            for d in model.deployments
        ]


def _smallest(limits: Iterable[int | None]) -> int | None:
    known = [limit for limit in limits if limit is not None]
    return min(known) if known else None


def max_output_tokens(model: CatalogModel, window: int | None) -> int:
    """The longest reply to offer agents: the configured limit, else a quarter of the window (at most
    ``DEFAULT_MAX_OUTPUT``); never more than the window leaves room for."""
    if model.max_output_tokens is not None:
        return min(model.max_output_tokens, window) if window else model.max_output_tokens
    if window is None:
        return DEFAULT_MAX_OUTPUT
    return max(min(DEFAULT_MAX_OUTPUT, window // 4), 1)
