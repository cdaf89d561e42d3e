"""The fallback endpoints the picker names after its pick (``turnout epp --fallbacks N``).

The Endpoint Picker protocol lets the picker name endpoints in order: ``x-gateway-destination-endpoint:
primary,fallback,...``. A data plane whose cluster knows the pool's endpoints (Envoy's
``override_host`` load-balancing policy, ``deploy/envoy/envoy-fallbacks.yaml``; the GIE-conformant
gateways) tries them in that order when a retry is due: the primary refused the connection, or reset
it before answering. Envoy's ORIGINAL_DST cluster (``deploy/envoy/envoy.yaml``) reads one endpoint
only, so fallbacks are off unless asked for.

The body Envoy forwards is the one the picker prepared for the primary (the upstream model name, a
llama.cpp ``id_slot``, the engine's auth header), and Envoy sends the same bytes to a fallback. So a
fallback is an engine that takes that very request: a candidate the decision kept (it passed every
filter: healthy, the window fits), of the same engine kind, serving the model under the same upstream
name with the same credentials, with the pinned slot (if any) among its own, and inside the data
plane's subset hint. Replicas of one configured backend (an endpoints file's ``turnout.dev/backend``
label) are that; a vLLM and a llama.cpp serving one model are not. They are named best score first.
"""

from __future__ import annotations

from collections.abc import Callable

from backends.base import Adapter
from policies import BackendSnapshot, Decision

MAX_FALLBACKS = 8
"""The most fallbacks ``--fallbacks`` may ask for."""


def fallbacks(
    decision: Decision,
    adapter: Callable[[str], Adapter],
    snapshots: tuple[BackendSnapshot, ...],
    allowed: Callable[[Adapter], bool],
    limit: int,
) -> list[str]:
    """Up to ``limit`` backend ids that can take the primary's very request, best score first
    (module docstring); ``allowed``: whether the data plane's subset hint lets an engine in."""
    chosen = decision.chosen
    if limit <= 0 or chosen is None:
        return []
    primary = adapter(chosen.backend_id)
    slot = decision.slot
    slots = {s.backend_id: s.total_slots for s in snapshots}
    ranked = sorted(
        (c for c in decision.candidates if c.deployment.backend_id != chosen.backend_id),
        key=lambda c: -c.score,
    )
    out: list[str] = []
    for candidate in ranked:
        deployment = candidate.deployment
        other = adapter(deployment.backend_id)
        if (
            deployment.backend_id in out
            or other.kind != primary.kind
            or deployment.upstream_name != chosen.upstream_name
            or other.spec.api_key != primary.spec.api_key
            or (slot is not None and (slots.get(deployment.backend_id) or 0) <= slot)
            or not allowed(other)
        ):
            continue
        out.append(deployment.backend_id)
        if len(out) == limit:
            break
    return out
