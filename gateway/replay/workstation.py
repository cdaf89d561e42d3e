"""The replay's default fleet, the two-backend workstation: a simulated vLLM and a simulated llama.cpp
serving one hybrid model (``StackOptions``), and the gateway settings over them (``gateway_settings``).
The wall replay starts them as servers (``stack``); the virtual one runs their engine models (``fleets``)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from backends.sim import SimConfig
from gateway.settings import load_settings
from policies import Architecture


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

    def sim_configs(self) -> dict[str, SimConfig]:
        """``vllm``: hybrid, prefix caching off; ``llama``: hybrid, ``llama_slots`` slots."""
        return {
            "vllm": SimConfig(
                kind="vllm",
                model=self.model,
                context_window=self.vllm_window,
                architecture=Architecture.HYBRID,
                prefix_caching=False,
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
        {"id": "vllm", "kind": "vllm", "url": urls["vllm"], "probe_interval_s": options.probe_interval_s},
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
