"""The dependency rule, checked on the source (at module level or inside a function): policies is pure,
backends never imports gateway, no module imports one that imports it back, and every module sits in
one layer of ``LAYERS`` and imports only from its own layer or those below (docs/architecture.md draws
them). A new module must be placed: the test names it until it is."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
PACKAGES = ("gateway", "backends", "policies")


def modules() -> dict[str, Path]:
    found = {}
    for package in PACKAGES:
        for path in (ROOT / package).rglob("*.py"):
            parts = path.relative_to(ROOT).with_suffix("").parts
            name = ".".join(parts[:-1] if parts[-1] == "__init__" else parts)
            found[name] = path
    return found


def imports(path: Path) -> set[str]:
    """Every module name ``path`` imports, anywhere in the file."""
    out: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        if isinstance(node, ast.Import):
            out.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            out.add(node.module)
            out.update(f"{node.module}.{alias.name}" for alias in node.names)
    return out


MODULES = modules()

LAYERS: tuple[tuple[str, tuple[str, ...]], ...] = (
    ("policies", ("policies",)),
    ("backends", ("backends",)),
    (
        "foundation",
        (
            "gateway",
            "gateway.errors",
            "gateway.api",
            "gateway.version",
            "gateway.logging",
            "gateway.record",
            "gateway.gc_pauses",
            "gateway.metrics",
            "gateway.traffic",
            "gateway.live",
            "gateway.disconnect",
            "gateway.streaming",
            "gateway.requests",
            "gateway.middleware",
            "gateway.settings",
            "gateway.settings_fleet",
            "gateway.catalog",
            "gateway.state",
            "gateway.key_limits",
            "gateway.access",
            "gateway.agents",
            "gateway.model_api",
            "gateway.replay.traces",
            "gateway.replay.synth",
            "gateway.replay.generate",
            "gateway.replay.results",
            "gateway.replay.workstation",
            "gateway.replay.client",
        ),
    ),
    (
        "routing",
        (
            "gateway.routed",
            "gateway.refusals",
            "gateway.decisions",
            "gateway.router_views",
            "gateway.routing",
            "gateway.timeline",
            "gateway.replicas",
        ),
    ),
    ("lifecycle", ("gateway.retry", "gateway.completion", "gateway.warming", "gateway.lifecycle")),
    ("core", ("gateway.core",)),
    (
        "front ends without HTTP",
        (
            "gateway.probe_check",
            "gateway.agents.configs",
            "gateway.replay",
            "gateway.replay.virtual",
            "gateway.replay.virtual_world",
            "gateway.replay.virtual_oracle",
            "gateway.replay.virtual_lookahead",
            "gateway.replay.oracle",
            "gateway.replay.fleets",
            "gateway.replay.yardsticks",
            "gateway.replay.report",
            "gateway.replay.simulate",
            "gateway.epp",
            "gateway.epp.wire",
            "gateway.epp.endpoints",
            "gateway.epp.answer",
            "gateway.epp.exchange",
            "gateway.epp.fallbacks",
        ),
    ),
    ("http", ("gateway.relay", "gateway.admin", "gateway.api.document", "gateway.app")),
    (
        "processes",
        (
            "gateway.serving",
            "gateway.demo",
            "gateway.replay.stack",
            "gateway.replay.runner",
            "gateway.replay.commands",
            "gateway.calibrate_command",
            "gateway.epp.server",
            "gateway.cli",
            "gateway.__main__",
        ),
    ),
)
"""Lowest first. A name places a module, or a package and everything in it that no longer name places."""
RANK = {name: rank for rank, (_, names) in enumerate(LAYERS) for name in names}


def layer(module: str) -> int | None:
    """The rank of ``module``'s layer: its own name's, else its nearest package's."""
    parts = module.split(".")
    for end in range(len(parts), 0, -1):
        rank = RANK.get(".".join(parts[:end]))
        if rank is not None:
            return rank
    return None


def test_every_module_has_a_layer() -> None:
    unplaced = sorted(name for name in MODULES if layer(name) is None)
    assert not unplaced, f"place these in LAYERS: {unplaced}"


@pytest.mark.parametrize("name", sorted(MODULES))
def test_no_import_goes_up(name: str) -> None:
    own = layer(name)
    assert own is not None
    upward = sorted(
        f"{target} ({LAYERS[rank][0]})"
        for target in imports(MODULES[name])
        if target in MODULES and (rank := layer(target)) is not None and rank > own
    )
    assert not upward, f"{name} ({LAYERS[own][0]}) imports from above: {upward}"


@pytest.mark.parametrize("name", sorted(n for n in MODULES if n.startswith("policies")))
def test_policies_are_pure(name: str) -> None:
    forbidden = ("gateway", "backends", "httpx", "litestar", "redis")
    found = sorted(i for i in imports(MODULES[name]) if i.split(".")[0] in forbidden)
    assert not found, f"{name} imports {found}"


@pytest.mark.parametrize("name", sorted(n for n in MODULES if n.startswith("backends")))
def test_backends_never_import_gateway(name: str) -> None:
    found = sorted(i for i in imports(MODULES[name]) if i.split(".")[0] == "gateway")
    assert not found, f"{name} imports {found}"


def test_no_two_modules_import_each_other() -> None:
    edges = {name: {i for i in imports(path) if i in MODULES and i != name} for name, path in MODULES.items()}
    pairs = sorted(
        {tuple(sorted((a, b))) for a, targets in edges.items() for b in targets if a in edges.get(b, ())}
    )
    packages = [
        (a, b) for a, b in pairs if not (MODULES[a].name == "__init__.py" or MODULES[b].name == "__init__.py")
    ]
    assert not packages, f"modules importing each other: {packages}"
