"""turnout's version, installed or not.

An installed turnout (``pip install``, the image) answers from its distribution's metadata. A source
checkout run without installing it (``PYTHONPATH=. python -m gateway``) has no metadata, so the
version comes from the checkout's ``pyproject.toml``; a tree with neither says ``0+unknown`` rather
than failing to start.
"""

from __future__ import annotations

import tomllib
from functools import cache
from importlib.metadata import PackageNotFoundError, version
from pathlib import Path

DISTRIBUTION = "turnout"
UNKNOWN = "0+unknown"
PYPROJECT = Path(__file__).resolve().parents[1] / "pyproject.toml"


@cache
def turnout_version() -> str:
    try:
        return version(DISTRIBUTION)
    except PackageNotFoundError:
        return version_in(PYPROJECT)


def version_in(pyproject: Path) -> str:
    """``project.version`` of a ``pyproject.toml`` naming turnout, else ``0+unknown``."""
    try:
        project = tomllib.loads(pyproject.read_text(encoding="utf-8")).get("project", {})
    except (OSError, tomllib.TOMLDecodeError):
        return UNKNOWN
    if project.get("name") != DISTRIBUTION or not isinstance(project.get("version"), str):
        return UNKNOWN
    return str(project["version"])
