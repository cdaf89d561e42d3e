"""The replay's default fleet, the two-backend workstation: a simulated vLLM and a simulated llama.cpp
serving one hybrid model (``StackOptions``), and the gateway settings over them (``gateway_settings``).
The wall replay starts them as servers (``stack``); the virtual one runs their engine models (``fleets``).
vLLM runs on the engine profile ``VLLM_PROFILE`` (DOMAIN.md's rates, vLLM 0.25's prefix cache of a
hybrid model in whole blocks), and the gateway is told so, as a calibrated deployment would be."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from backends.engine_profiles import load_profile
from backends.sim import SimConfig
from gateway.settings import load_settings
from policies import Architecture

VLLM_PROFILE = "seed-5090-vllm-27b"
"""The default fleet's vLLM (``seed-5090-vllm-0.24-27b`` is the same engine before vLLM 0.25)."""


@dataclass(frozen=True, slots=True)
class StackOptions:
    """The simulated fleet of a replay (defaults: DOMAIN.md rates, large windows)."""

    model: str = "replay"
    time_scale: float = 0.05
    vllm_window: int = 94000
    llama_window: int = 65536
    llama_slots: int = 2
    probe_interval_s: float = 0.1
    """Gateway probe period in wall seconds."""
    vllm_profile: str = VLLM_PROFILE
    """vLLM's engine profile (``seed-5090-vllm-0.24-27b``: the same engine with no prefix cache)."""

    def sim_configs(self) -> dict[str, SimConfig]:
        """``vllm``: hybrid, on ``vllm_profile`` (prefix caching in its blocks where it measured them);
        ``llama``: hybrid, ``llama_slots`` slots."""
        return {
            "vllm": SimConfig(
                kind="vllm",
                model=self.model,
                context_window=self.vllm_window,
                architecture=Architecture.HYBRID,
                prefix_caching=True,
                profile=load_profile(self.vllm_profile),
                time_scale=self.time_scale,
            ),
            "llama": SimConfig(
                kind="llamacpp",
                model=self.model,
                context_window=self.llama_window,
                architecture=Architecture.HYBRID,
                slots=self.llama_slots,
                time_scale=self.time_scale,
            ),
        }


def gateway_settings(urls: dict[str, str], options: StackOptions, profile: str) -> Any:
    """Settings of a gateway over the two simulators serving ``options.model`` with ``profile``: their
    windows, and the llama.cpp slots for a virtual replay (``fleets``; a served gateway ignores it)."""
    backends = [
        {
            "id": "vllm",
            "kind": "vllm",
            "url": urls["vllm"],
            "probe_interval_s": options.probe_interval_s,
            "engine_profile": options.vllm_profile,
        },
        {
            "id": "llama",
            "kind": "llamacpp",
            "url": urls["llama"],
            "probe_interval_s": options.probe_interval_s,
            "sim": {"slots": options.llama_slots},
        },
    ]
    models = [
        {
            "name": options.model,
            "architecture": "hybrid",
            "deployments": [
                {"backend": "vllm", "upstream_name": options.model, "context_window": options.vllm_window},
                {"backend": "llama", "upstream_name": options.model, "context_window": options.llama_window},
            ],
        }
    ]
    return load_settings(None, backends=backends, models=models, profile=profile, log_level="warning")
