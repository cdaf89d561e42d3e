"""``turnout sim vllm|llamacpp --port N ...``: serve one simulated engine with uvicorn in the foreground.

Parsing (:func:`parse_args`) is separate from serving so it can be tested without a socket.
"""

from __future__ import annotations

import argparse
from dataclasses import dataclass

from backends.engine_profiles import ProfileNotFound, load_profile
from backends.sim.config import SimConfig
from policies.engine_profile import ProfileSchemaError
from policies.types import Architecture


@dataclass(frozen=True, slots=True)
class ServeOptions:
    """Where to listen and what to simulate."""

    host: str
    port: int
    config: SimConfig


def build_parser() -> argparse.ArgumentParser:
    """The ``sim`` argument parser; ``argv[0]`` is the engine kind."""
    parser = argparse.ArgumentParser(prog="turnout sim", description="Run a simulated inference engine.")
    parser.add_argument("kind", choices=["vllm", "llamacpp"])
    parser.add_argument("--port", type=int, required=True)
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument(
        "--model", default="sim-model", help="served name (vLLM --served-model-name, llama --alias)"
    )
    parser.add_argument("--context-window", type=int, default=32768)
    parser.add_argument("--slots", type=int, default=2, help="llama.cpp -np")
    parser.add_argument(
        "--max-num-seqs",
        type=int,
        default=0,
        help="vLLM --max-num-seqs (0: 256, fewer where a hybrid's pool says)",
    )
    parser.add_argument("--time-scale", type=float, default=1.0)
    parser.add_argument(
        "--engine-profile",
        help="run on this engine profile: a built-in name or a `turnout calibrate` file (docs/calibrate.md);"
        " it wins over the rates below",
    )
    parser.add_argument("--prefill-tok-s", type=float, default=0.0, help="0 = the engine's default")
    parser.add_argument("--decode-tok-s", type=float, default=0.0, help="0 = the engine's default")
    parser.add_argument(
        "--batch-slowdown",
        type=float,
        default=0.06,
        help="decode step time grows by this share per other running request (0: none; load tests)",
    )
    parser.add_argument(
        "--architecture", choices=[a.value for a in Architecture], default=Architecture.HYBRID.value
    )
    parser.add_argument("--prefix-caching", action=argparse.BooleanOptionalAction, default=True)
    parser.add_argument(
        "--block-size", type=int, default=0, help="a hybrid's prefix-cache block (0: the profile's, else 256)"
    )
    parser.add_argument("--api-key", default=None)
    parser.add_argument("--slot-save-path", default=None, help="llama.cpp: where slot files are saved")
    parser.add_argument(
        "--enable-sleep-mode",
        action="store_true",
        help="vLLM: /sleep, /wake_up, /collective_rpc, /is_sleeping (real vLLM: with VLLM_SERVER_DEV_MODE=1)",
    )
    parser.add_argument("--load-seconds", type=float, default=0.0)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument(
        "--tool-calls",
        action=argparse.BooleanOptionalAction,
        default=True,
        help="call the first offered tool after a user message (off: answer in text)",
    )
    parser.add_argument(
        "--cache-ram", type=int, default=8192, help="llama.cpp RAM prompt cache in MiB (0 off, -1 no limit)"
    )
    parser.add_argument(
        "--cache-idle-slots",
        action=argparse.BooleanOptionalAction,
        default=True,
        help="llama.cpp: save idle slots to the RAM cache when a task starts",
    )
    return parser


def parse_args(argv: list[str]) -> ServeOptions:
    """Parse ``argv`` (``[kind, options...]``) into :class:`ServeOptions`; exits with code 2 on errors."""
    parser = build_parser()
    ns = parser.parse_args(argv)
    profile = None
    if ns.engine_profile:
        try:
            profile = load_profile(ns.engine_profile)
        except (ProfileNotFound, ProfileSchemaError) as exc:
            parser.error(str(exc))
        if profile.engine != ns.kind:
            parser.error(f"{ns.engine_profile} is a {profile.engine} profile, not {ns.kind}")
    config = SimConfig(
        kind=ns.kind,
        model=ns.model,
        context_window=ns.context_window,
        architecture=Architecture(ns.architecture),
        slots=ns.slots,
        max_num_seqs=ns.max_num_seqs,
        prefix_caching=ns.prefix_caching,
        block_size=ns.block_size,
        prefill_tok_s=ns.prefill_tok_s,
        decode_tok_s=ns.decode_tok_s,
        batch_slowdown=ns.batch_slowdown,
        time_scale=ns.time_scale,
        api_key=ns.api_key,
        load_seconds=ns.load_seconds,
        enable_sleep_mode=ns.enable_sleep_mode,
        slot_save_path=ns.slot_save_path,
        seed=ns.seed,
        tool_calls=ns.tool_calls,
        cache_ram_mib=ns.cache_ram,
        cache_idle_slots=ns.cache_idle_slots,
        profile=profile,
    )
    return ServeOptions(ns.host, ns.port, config)


def sim_main(argv: list[str]) -> int:
    """Serve the simulator described by ``argv`` until SIGINT/SIGTERM; returns the exit code."""
    import uvicorn

    from backends.sim.app import create_sim_app

    options = parse_args(argv)
    uvicorn.run(create_sim_app(options.config), host=options.host, port=options.port, log_level="warning")
    return 0
