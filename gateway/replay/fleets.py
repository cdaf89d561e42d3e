"""The simulated fleet a virtual replay runs on: the gateway's settings, and an engine model per backend.

The default is docs/replay.md's workstation: ``vllm`` (hybrid, a 94,000-token window, on the engine
profile ``seed-5090-vllm-27b``: DOMAIN.md's rates and vLLM 0.25's prefix cache, whole 1,568-token
blocks) and ``llama`` (hybrid, ``llama_slots`` slots of 65,536 tokens, its RAM prompt cache at the
default 8 GiB, at DOMAIN.md's rates), probed every 2 simulated seconds. ``--backends FILE`` replays on
the backends of a turnout config instead (at most :data:`MAX_BACKENDS`): each backend's engine model
takes its kind, the upstream name and window of its deployment of the replayed model (a model group:
of its members; of its first deployment if it serves none of them), that model's architecture, and
the backend's ``[backends.sim]`` table (slots, rates, chunk, prefix caching, ...). vLLM's prefix cache
defaults to on for a hybrid model where the backend's engine profile measured its blocks (vLLM 0.25),
off for one without (vLLM 0.24 and older reuse nothing of a hybrid model), and on otherwise.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from backends.sim import SimConfig
from gateway.replay.workstation import VLLM_PROFILE, StackOptions, gateway_settings
from gateway.settings import ConfigError, Settings, load_settings, served_models
from policies.types import Architecture, EngineKind

MAX_BACKENDS = 16
PROBE_INTERVAL_S = 2.0
"""Simulated seconds between probes of the default fleet (the wall replay's 0.1 s at scale 0.05)."""


def default_fleet(
    model: str, profile: str, llama_slots: int = 2, vllm_profile: str = VLLM_PROFILE
) -> Settings:
    """The two-backend workstation (module docstring) serving ``model`` with ``profile``."""
    urls = {"vllm": "http://vllm.virtual", "llama": "http://llama.virtual"}
    options = StackOptions(
        model=model, llama_slots=llama_slots, probe_interval_s=PROBE_INTERVAL_S, vllm_profile=vllm_profile
    )
    settings: Settings = gateway_settings(urls, options, profile)
    return settings


def fleet_from_file(path: Path, profile: str) -> Settings:
    """The settings of the turnout config at ``path``, with ``profile``."""
    settings = load_settings(path, profile=profile, log_level="warning")
    if len(settings.backends) > MAX_BACKENDS:
        raise ConfigError(
            f"{path}: {len(settings.backends)} backends; a replay simulates at most {MAX_BACKENDS}"
        )
    return settings


def sim_configs(settings: Settings, model: str, seed: int = 0) -> dict[str, SimConfig]:
    """An engine model per backend of ``settings`` (module docstring), replaying ``model``."""
    served = served_models(settings, model)
    configs: dict[str, SimConfig] = {}
    for backend in settings.backends:
        if backend.kind is EngineKind.OPENAI:
            kind = "a generic OpenAI server"
            raise ConfigError(f"backend {backend.id!r} is {kind}: a replay simulates vllm and llamacpp only")
        own = [(m, d) for m in served for d in m.deployments if d.backend == backend.id]
        others = [d for m in settings.models for d in m.deployments if d.backend == backend.id]
        deployment = own[0][1] if own else others[0] if others else None
        architecture = own[0][0].architecture if own else _architecture(settings, backend.id)
        sim = backend.sim
        profile = backend.load_engine_profile()
        measured = profile is not None and profile.align_block > 0  # vLLM 0.25's hybrid prefix cache
        fields: dict[str, Any] = sim.model_dump(exclude_none=True, exclude={"prefix_caching"})
        if deployment is not None and deployment.context_window is not None:
            fields = {"context_window": deployment.context_window, **fields}
        configs[backend.id] = SimConfig(
            kind="vllm" if backend.kind is EngineKind.VLLM else "llamacpp",
            model=deployment.upstream_name if deployment is not None else backend.id,
            architecture=architecture,
            prefix_caching=sim.prefix_caching
            if sim.prefix_caching is not None
            else architecture is not Architecture.HYBRID or measured,
            seed=seed,
            profile=profile,
            **fields,
        )  # one construction: what it resolves (the pool's sequences, the block) sees every field
    return configs


def capacity(settings: Settings, model: str, configs: dict[str, SimConfig]) -> float:
    """The prefill capacity (tokens/s, all engines together) of the backends serving ``model`` (a
    group: any of its members)."""
    served = {d.backend for m in served_models(settings, model) for d in m.deployments}
    return sum(config.prefill_tok_s for name, config in configs.items() if name in served)


def _architecture(settings: Settings, backend: str) -> Architecture:
    for model in settings.models:
        if any(d.backend == backend for d in model.deployments):
            return model.architecture
    return Architecture.DENSE
