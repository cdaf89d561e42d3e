"""The dependency rule, checked on the source: policies is pure, backends never imports gateway, and
no module imports one that imports it back (at module level or inside a function)."""

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
