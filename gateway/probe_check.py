"""``turnout config check``: probe every configured backend once and report what it serves.

A ready llama-server with two slots or more is also tested for keeping a slot's cache while another
slot works (``LlamaCppAdapter.slot_test``: a few tokens on slots 0 and 1, only while every slot is
idle): one that clears idle slots (``--kv-unified`` with ``--cache-idle-slots``) makes every pinned
session re-prefill, and fails the check with the fix (``backends.slot_watch``).
"""

from __future__ import annotations

import httpx

from backends.llamacpp import LlamaCppAdapter
from backends.slot_watch import CLEARED_IDLE_SLOTS
from gateway.core import build_core, one_replica
from gateway.settings import Settings
from policies.types import Health


async def check_backends(settings: Settings) -> int:
    """Print one line per backend and a verdict; 0 when every backend is ready, serves its
    deployments and keeps its slots' caches, else 3 (an engine still loading counts as not ready:
    run it again, or script it with ``until turnout config check FILE; do sleep 10; done``)."""
    problems = 0
    async with httpx.AsyncClient() as client:
        core = build_core(one_replica(settings), client=client, record=False)
        core.fleet.log_health = False  # the table below says each probe once
        for snapshot in await core.fleet.probe_all():
            missing = [
                d.upstream_name for d in snapshot.deployments if d.upstream_name not in snapshot.served_names
            ]
            ok = snapshot.health is Health.READY and not missing
            detail = snapshot.error or ""
            if snapshot.health is Health.READY:
                windows = ", ".join(
                    f"{d.upstream_name} ({d.context_window} tokens)" for d in snapshot.deployments
                )
                detail = f"serves {', '.join(snapshot.served_names) or 'nothing'}; deployments: {windows}"
                if missing:
                    detail += f"; NOT SERVED: {', '.join(missing)}"
            adapter = core.fleet.adapter(snapshot.backend_id)
            if ok and isinstance(adapter, LlamaCppAdapter):
                kept = await adapter.slot_test()
                if kept:
                    detail += "; slots keep their cache"
                elif kept is False:
                    ok = False
                    detail += f"; {CLEARED_IDLE_SLOTS}"
                elif kept is None:
                    detail += "; slot cache not tested (fewer than 2 slots, or a slot busy)"
            problems += not ok
            print(f"  {snapshot.backend_id:<16} {snapshot.kind.value:<9} {snapshot.health.value:<8} {detail}")
    count = len(settings.backends)
    if problems:
        print(
            f"{problems} of {count} backends not ready, not serving their models, or clearing their slots"
            " (exit status 3)"
        )
        return 3
    print(f"all {count} backends ready, serving every deployment")
    return 0
