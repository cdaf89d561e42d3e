"""The ``turnout`` command: serve, demo, sim, config check, agents, trace, replay, calibrate."""

from __future__ import annotations

import argparse
import asyncio
import os
import sys
from collections.abc import Sequence
from pathlib import Path

from gateway.calibrate_command import add_calibrate_parser
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


def cmd_epp(args: argparse.Namespace) -> int:
    settings = _load(args.config)
    try:
        from gateway.epp.endpoints import EndpointsError, read_endpoints, with_endpoints
        from gateway.epp.server import serve_picker
    except ImportError as exc:
        print(f"turnout epp needs the epp extra (pip install 'turnout[epp]'): {exc}", file=sys.stderr)
        return 2
    if args.endpoints is not None:
        try:
            settings = with_endpoints(settings, read_endpoints(Path(args.endpoints)))
        except EndpointsError as exc:
            print(f"turnout: {exc}", file=sys.stderr)
            return 2
    if not settings.backends:
        print("turnout: no backends configured; pass --config FILE", file=sys.stderr)
        return 2
    from gateway.epp.fallbacks import MAX_FALLBACKS

    if not 0 <= args.fallbacks <= MAX_FALLBACKS:
        print(f"turnout: --fallbacks must be 0 to {MAX_FALLBACKS}, not {args.fallbacks}", file=sys.stderr)
        return 2
    from gateway.logging import configure_logging

    configure_logging(settings.log_format, settings.log_level)
    serving = serve_picker(
        settings, args.listen, grace_s=args.grace, metrics=args.metrics, fallbacks=args.fallbacks
    )
    asyncio.run(serving)
    return 0


def cmd_demo(args: argparse.Namespace) -> int:
    from gateway.demo import run_demo

    return run_demo(traffic=args.traffic, verbose=args.verbose)


def cmd_config_check(args: argparse.Namespace) -> int:
    from gateway.probe_check import check_backends

    settings = load_settings(Path(args.file))
    print(f"{args.file}: valid ({len(settings.backends)} backends, {len(settings.models)} models)")
    if args.no_probe:
        return 0
    return asyncio.run(check_backends(settings))


def local_gateway_url() -> str:
    """The gateway on this machine, where ``TURNOUT_HOST`` / ``TURNOUT_PORT`` put it (as for ``turnout
    demo`` and ``turnout serve``); a wildcard host is reached on loopback."""
    host = os.environ.get("TURNOUT_HOST") or "127.0.0.1"
    if host in ("0.0.0.0", "::", ""):
        host = "127.0.0.1"
    host = f"[{host}]" if ":" in host else host
    return f"http://{host}:{os.environ.get('TURNOUT_PORT') or 8484}"


def cmd_agents(args: argparse.Namespace) -> int:
    from gateway.agents.configs import (
        AGENTS,
        PLACEHOLDER_KEY,
        AgentConfigError,
        Target,
        from_gateway,
        from_settings,
        pick,
    )

    try:
        if args.config is not None:
            settings = load_settings(Path(args.config))
            url = args.url or f"http://{settings.host}:{settings.port}"
            models = from_settings(settings)
        else:
            url = args.url or local_gateway_url()
            models = from_gateway(url)
        target = Target(
            url=url.rstrip("/"),
            api_key=args.api_key or os.environ.get("TURNOUT_API_KEY") or PLACEHOLDER_KEY,
            model=pick(models, args.model),
            small_model=pick(models, args.small_model or args.model),
        )
    except AgentConfigError as exc:
        print(f"turnout agents: {exc}", file=sys.stderr)
        return 1
    setups = {name: AGENTS[name](target) for name in args.agent or list(AGENTS)}
    if args.out is None:
        print("\n".join(setup.text() for setup in setups.values()), end="")
        return 0
    for name, setup in setups.items():
        for path in setup.write(Path(args.out) / name):
            print(path)
    return 0


def build_parser() -> argparse.ArgumentParser:
    from gateway.version import turnout_version

    parser = argparse.ArgumentParser(
        prog="turnout", description="Routing inference gateway for local LLM engines."
    )
    parser.add_argument("--version", action="version", version=f"%(prog)s {turnout_version()}")
    commands = parser.add_subparsers(dest="command", required=True)

    serve = commands.add_parser("serve", help="run the gateway (config from --config or TURNOUT_CONFIG)")
    serve.add_argument("--config", help="TOML config file")
    serve.set_defaults(func=cmd_serve)

    epp = commands.add_parser(
        "epp",
        help="serve as the Endpoint Picker of Envoy / the Gateway API Inference Extension (ext_proc gRPC)",
    )
    epp.add_argument("--config", help="TOML config file (the same as turnout serve's)")
    epp.add_argument(
        "--listen", default="0.0.0.0:9002", help="host:port of the gRPC server (default %(default)s)"
    )
    epp.add_argument(
        "--metrics", help="host:port to serve Prometheus metrics on (GET /metrics); default: none"
    )
    epp.add_argument(
        "--endpoints",
        help="an endpoints file (llm-d's file-discovery format): where the configured backends' engines are",
    )
    epp.add_argument(
        "--fallbacks",
        type=int,
        default=0,
        help="name up to N fallback endpoints after each pick, for a data plane that tries them in "
        "order (Envoy's override_host policy, deploy/envoy/envoy-fallbacks.yaml; not ORIGINAL_DST, "
        "which reads one); default %(default)s",
    )
    epp.add_argument(
        "--grace",
        type=float,
        default=5.0,
        help="seconds to let requests finish on SIGTERM (default %(default)s)",
    )
    epp.set_defaults(func=cmd_epp)

    demo = commands.add_parser("demo", help="run the gateway on simulated vLLM and llama.cpp backends")
    demo.add_argument(
        "--traffic",
        action=argparse.BooleanOptionalAction,
        default=True,
        help="send a little background traffic so the dashboard is alive (default: on)",
    )
    demo.add_argument(
        "--verbose",
        action="store_true",
        help="print every log line here (default: to ~/.cache/turnout/demo/turnout.log, warnings here too)",
    )
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

    from gateway.agents.configs import AGENTS

    agents = commands.add_parser(
        "agents",
        help="print each coding agent's settings for this gateway (window, output limit, base URL)",
        description="Settings for Claude Code, Codex, OpenCode and aider, with the windows of the running "
        "gateway (--url) or of a config file (--config). See docs/agents.md.",
    )
    agents.add_argument(
        "--url", help="the running gateway (default http://127.0.0.1:8484, or TURNOUT_HOST / TURNOUT_PORT)"
    )
    agents.add_argument("--config", help="read the windows from this config file instead of a gateway")
    agents.add_argument("--model", help="the model the agents use (default: the first one)")
    agents.add_argument("--small-model", help="for background chores (titles, summaries); default --model")
    agents.add_argument("--agent", action="append", choices=list(AGENTS), help="only this agent (repeatable)")
    agents.add_argument(
        "--api-key", help="the token agents send (default $TURNOUT_API_KEY, else a placeholder)"
    )
    agents.add_argument("--out", help="write each agent's files under OUT/<agent>/ instead of printing them")
    agents.set_defaults(func=cmd_agents)

    add_trace_parser(commands)
    add_replay_parser(commands)
    add_calibrate_parser(commands)
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
