"""What several gateway replicas learned, merged (``policies.learning``'s docstring, "Replicas"):
each measured value weighted by its samples (capped at ``MERGE_WEIGHT_CAP``), the priors of the
replica merging kept, nothing counted twice."""

from __future__ import annotations

import math
from collections.abc import Sequence
from types import MappingProxyType

from policies.learning import MERGE_WEIGHT_CAP, DeploymentStats, Ewma, LearnedState, ModelStats


def _merge_ewma(values: Sequence[Ewma]) -> Ewma:
    measured = [v for v in values if v.samples > 0]
    if not measured:
        return values[0]
    weights = [min(v.samples, MERGE_WEIGHT_CAP) for v in measured]
    value = sum(v.value * w for v, w in zip(measured, weights, strict=True)) / sum(weights)
    first = values[0]
    return Ewma(
        value, first.prior, sum(v.samples for v in measured), first.ratio, first.rate,
        aside=sum(v.aside for v in values), held=first.held,
        last_aside=first.last_aside, last_against=first.last_against,
    )  # fmt: skip


def _merge_stats(stats: Sequence[DeploymentStats]) -> DeploymentStats:
    merged = {
        name: _merge_ewma([getattr(s, name) for s in stats])
        for name in (
            "prefill_tok_s",
            "decode_tok_s",
            "reuse",
            "service_s",
            "ram_reuse",
            "ram_tokens",
            "queue_factor",
            "live",
        )
    }
    return DeploymentStats(**merged, block=math.gcd(*(s.block for s in stats)))


def merge(own: LearnedState, others: Sequence[LearnedState]) -> LearnedState:
    """What all replicas learned (module docstring, "Replicas"); ``own`` first, its priors kept."""
    states = [own, *others]
    if not others:
        return own
    deployments = {
        key: _merge_stats([s.deployments[key] for s in states if key in s.deployments])
        for key in dict.fromkeys(k for s in states for k in s.deployments)
    }
    models = {
        key: ModelStats(
            _merge_ewma([s.models[key].chars_per_token for s in states if key in s.models]),
            _merge_ewma([s.models[key].completion_tokens for s in states if key in s.models]),
        )
        for key in dict.fromkeys(k for s in states for k in s.models)
    }
    clients = {
        key: _merge_ewma([s.clients[key] for s in states if key in s.clients])
        for key in dict.fromkeys(k for s in states for k in s.clients)
    }
    return LearnedState(
        MappingProxyType(deployments),
        MappingProxyType(models),
        _merge_ewma([s.speed for s in states]),
        MappingProxyType(clients),
    )
