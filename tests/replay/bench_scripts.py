"""The scripts of bench/ (scripts, not a package), imported for their tests."""

from __future__ import annotations

import importlib
import sys
from pathlib import Path
from types import ModuleType

BENCH = Path(__file__).resolve().parents[2] / "bench"


def bench_scripts(*names: str) -> tuple[ModuleType, ...]:
    """Import ``names`` from bench/, on ``sys.path`` only while they load: their own modules
    (routing, state, ...) must not shadow anything for the tests after these."""
    path = str(BENCH)
    sys.path.insert(0, path)
    try:
        return tuple(importlib.import_module(name) for name in names)
    finally:
        while path in sys.path:
            sys.path.remove(path)
