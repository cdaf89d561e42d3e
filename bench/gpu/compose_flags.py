"""Print compose.yaml's llama-server (or vLLM) flags for a run outside compose, one per line.

    python3 bench/gpu/compose_flags.py --model /dev/shm/m.gguf --port 8080 [--one-gpu] \
        [--set ubatch-size=4096 ...]
    python3 bench/gpu/compose_flags.py --service vllm --model /dev/shm/q27 --port 8000 --one-gpu

``--model``, ``--host`` and ``--port`` are replaced by the run's own (vLLM's positional model becomes
``--model``, as its API server takes it); ``${VAR:-default}`` takes its default; ``--one-gpu`` drops
``--split-mode`` and ``--tensor-split`` (llama-server) or ``--tensor-parallel-size`` (vLLM): they need
two cards;
``--set NAME=VALUE`` replaces (or adds) ``--NAME VALUE``, ``--set NAME`` adds a bare ``--NAME`` and
``--drop NAME`` leaves ``--NAME`` out. What runs
on the GPU is therefore compose.yaml itself, not a copy of its flags.
"""

from __future__ import annotations

import argparse
import re
from pathlib import Path

import yaml

COMPOSE = Path(__file__).resolve().parents[2] / "compose.yaml"
VARIABLE = re.compile(r"\$\{[A-Z_]+:-([^}]*)\}")
TWO_GPUS = ("--split-mode", "--tensor-split", "--tensor-parallel-size")


def compose_flags(path: Path = COMPOSE, service: str = "llama") -> list[list[str]]:
    """A service's command as [flag, value?] groups, variables at their defaults; a positional
    argument before the first flag (``vllm serve MODEL``) is the ``--model`` group."""
    command = yaml.safe_load(path.read_text())["services"][service]["command"]
    groups: list[list[str]] = []
    for item in (VARIABLE.sub(r"\1", str(part)) for part in command):
        if item.startswith("--"):
            groups.append([item])
        elif groups:
            groups[-1].append(item)
        else:
            groups.append(["--model", item])
    return groups


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    parser.add_argument("--service", default="llama", choices=("llama", "vllm"))
    parser.add_argument("--model", required=True)
    parser.add_argument("--port", default="8080")
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--one-gpu", action="store_true")
    parser.add_argument("--set", action="append", default=[], metavar="NAME[=VALUE]")
    parser.add_argument("--drop", action="append", default=[], metavar="NAME", help="leave out --NAME")
    args = parser.parse_args()
    groups = compose_flags(service=args.service)
    own = {"--model": args.model, "--host": args.host, "--port": args.port}
    out: list[list[str]] = []
    for group in groups:
        if group[0] in own or (args.one_gpu and group[0] in TWO_GPUS):
            continue
        out.append(group)
    out += [[flag, value] for flag, value in own.items()]
    out = [g for g in out if g[0] not in {f"--{name}" for name in args.drop}]
    for change in args.set:
        name, _, value = change.partition("=")
        group = [f"--{name}", *([value] if value else [])]
        out = [g for g in out if g[0] != group[0]] + [group]
    print("\n".join(part for group in out for part in group))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
