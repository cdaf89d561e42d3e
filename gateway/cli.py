"""The ``turnout`` command: serve, demo, sim, config check."""

from __future__ import annotations

import argparse
import asyncio
import os
import sys
from collections.abc import Sequence
from pathlib import Path

from gateway.replay.commands import add_replay_parser, add_trace_parser
from gateway.serving import run_gateway
from gateway.settings import ConfigError, Settings, load_settings


def _load(path: str | None) -> Settings:
    config = path or os.environ.get("TURNOUT_CONFIG")
    return load_settings(Path(config) if config else None)


def cmd_serve(args: argparse.Namespace) -> int:
    settings = _load(args.config)
    if not settings.backends:
        print("turnout: no backends configured; pass --config FILE (or run `turnout demo`)", file=sys.stderr)
        return 2
    run_gateway(settings)
    return 0


def cmd_demo(args: argparse.Namespace) -> int:
    from gateway.demo import run_demo

    return run_demo()


def cmd_config_check(args: argparse.Namespace) -> int:
    from gateway.probe_check import check_backends

    settings = load_settings(Path(args.file))
    print(f"{args.file}: valid ({len(settings.backends)} backends, {len(settings.models)} models)")
    if args.no_probe:
        return 0
    return asyncio.run(check_backends(settings))


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="turnout", description="Routing inference gateway for local LLM engines."
    )
    commands = parser.add_subparsers(dest="command", required=True)

    serve = commands.add_parser("serve", help="run the gateway (config from --config or TURNOUT_CONFIG)")
    serve.add_argument("--config", help="TOML config file")
    serve.set_defaults(func=cmd_serve)

    demo = commands.add_parser("demo", help="run the gateway on simulated vLLM and llama.cpp backends")
    demo.set_defaults(func=cmd_demo)

    commands.add_parser(
        "sim", help="run an engine simulator: turnout sim vllm|llamacpp --port N ...", add_help=False
    )

    config = commands.add_parser("config", help="configuration tools")
    config_commands = config.add_subparsers(dest="config_command", required=True)
    check = config_commands.add_parser("check", help="validate a config file and probe its backends")
    check.add_argument("file")
    check.add_argument("--no-probe", action="store_true", help="validate only; do not contact the backends")
    check.set_defaults(func=cmd_config_check)

    add_trace_parser(commands)
    add_replay_parser(commands)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    args_list = list(sys.argv[1:] if argv is None else argv)
    if args_list[:1] == ["sim"]:
        from backends.sim import sim_main

        return sim_main(args_list[1:])
    args = build_parser().parse_args(args_list)
    try:
        code: int = args.func(args)
    except ConfigError as exc:
        print(f"turnout: invalid configuration: {exc}", file=sys.stderr)
        return 1
    except KeyboardInterrupt:
        return 130
    return code
