"""Codex CLI's model catalog: the ``models`` list Codex fetches from ``model_catalog_url``.

Codex (0.171.0) warns "Model metadata for `<model>` not found. Defaulting to fallback metadata" for
any model it has no catalog entry for, even with ``model_context_window`` set. Given a provider with
``model_catalog_url`` and ``env_key``, it fetches ``GET <url>?client_version=<version>`` and decodes
``{"models": [ModelInfo, ...]}``; the fields below are the ones its decoder requires, with the values
of its own fallback metadata, plus the window. An entry's ``base_instructions`` replaces Codex's system
prompt, so it is Codex's own (``codex_prompt.md``, Apache-2.0, see ``NOTICE``).

Codex compacts at 90% of ``context_window`` and clamps a configured window to ``max_context_window``.
"""

from __future__ import annotations

from functools import cache
from importlib.resources import files
from typing import Any

CODEX_QUERY = "client_version"
"""Codex adds ``?client_version=<its version>`` to every catalog fetch."""


@cache
def base_instructions() -> str:
    return files("gateway.agents").joinpath("codex_prompt.md").read_text(encoding="utf-8")


def codex_model(name: str, display_name: str, window: int | None, priority: int) -> dict[str, Any]:
    """One catalog entry: Codex's fallback metadata with this model's name and window."""
    entry: dict[str, Any] = {
        "slug": name,
        "display_name": display_name,
        "description": "served by turnout",
        "supported_reasoning_levels": [],
        "shell_type": "shell_command",
        "visibility": "list",
        "supported_in_api": True,
        "priority": priority,
        "support_verbosity": False,
        "truncation_policy": {"mode": "bytes", "limit": 10_000},
        "experimental_supported_tools": [],
        "supports_parallel_tool_calls": False,
        "input_modalities": ["text"],
        "base_instructions": base_instructions(),
    }
    if window is not None:
        entry["context_window"] = entry["max_context_window"] = window
    return entry
