"""What the dashboard shows of a deployment's learned state: its rates against their priors, and the
rate samples learning set aside (``policies.ewma``) with why."""

from __future__ import annotations

from typing import Any

from policies.learning import FAR, DeploymentStats
from policies.types import EngineKind


def learned_row(model: str, stats: DeploymentStats, kind: EngineKind) -> dict[str, Any]:
    return {
        "model": model,
        "prefill_tok_s": round(stats.prefill_tok_s.value, 1),
        "prefill_prior": round(stats.prefill_tok_s.prior, 1),
        "decode_tok_s": round(stats.decode_tok_s.value, 1),
        "decode_prior": round(stats.decode_tok_s.prior, 1),
        "samples": stats.prefill_tok_s.samples,
        "reuse": round(stats.reuse.value, 3),
        "set_aside": _set_aside(stats),
    }


def _set_aside(stats: DeploymentStats) -> str:
    """The rate samples learning set aside (``policies.ewma``), and why, in one line ("" for none)."""
    parts = []
    for name, rate in (("prefill", stats.prefill_tok_s), ("decode", stats.decode_tok_s)):
        if rate.aside:
            off = max(rate.last_aside / rate.last_against, rate.last_against / rate.last_aside)
            parts.append(
                f"{name} {rate.aside}: last {rate.last_aside:,.0f} tok/s, {off:.0f}x the learned "
                f"{rate.last_against:,.0f} (more than {FAR:.0f}x faster, alone: a measurement error)"
            )
    return "; ".join(parts)
