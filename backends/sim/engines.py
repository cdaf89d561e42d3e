"""The engine model of a :class:`~backends.sim.config.SimConfig`: one place that picks it by kind."""

from __future__ import annotations

from backends.clock import WALL, Clock
from backends.sim.config import SimConfig
from backends.sim.engine_base import BatchEngine
from backends.sim.llama_engine import LlamaEngine
from backends.sim.vllm_engine import VllmEngine


def create_engine(config: SimConfig, clock: Clock = WALL) -> BatchEngine:
    """The simulated llama.cpp or vLLM engine ``config`` describes, reading ``clock``."""
    if config.kind == "llamacpp":
        return LlamaEngine(config, clock=clock)
    return VllmEngine(config, clock=clock)
