"""Faithful in-process HTTP simulators of vLLM and llama.cpp ``llama-server`` for tests and demos.

``create_sim_app(SimConfig(kind="llamacpp"))`` returns a Litestar app; ``app.state.sim`` is the engine
(``.events``, ``.tokenizer``). ``sim_main(["vllm", "--port", "8001"])`` serves one from the command line.
"""

from backends.sim.app import create_sim_app
from backends.sim.cli import sim_main
from backends.sim.config import SimConfig
from backends.sim.events import EventKind, SimEvent

__all__ = ["EventKind", "SimConfig", "SimEvent", "create_sim_app", "sim_main"]
