"""What gateway replicas on one Redis share beyond the request path: what they learned and their load.

Sessions, slot leases and the decision log live in the shared store, and the prefix index's records
travel through its stream (``gateway.state.prompt_log``). Twice a second each replica also:

- publishes what it learned from its own outcomes (``learned``, kept ``LEARNED_TTL_S``: a restarted
  gateway starts from what the fleet knew) and routes on the merge of its own and the others'
  (``policies.learning_merge.merge``: merged, never overwritten, nothing counted twice);
- publishes its requests in flight per backend (``load``, gone ``LOAD_TTL_S`` after the replica's last
  word: a replica that dies stops counting), and lays the others' prefill backlog over its
  snapshots (``backends.load.Load``).

With the in-memory store there is no one to share with and nothing runs.
"""

from __future__ import annotations

import asyncio
import time

import msgspec
import structlog

from backends.fleet import Fleet
from backends.load import Load
from gateway.routing import Router
from policies.learning import DeploymentStats, Ewma, LearnedState, ModelStats
from policies.learning_merge import merge

log = structlog.get_logger(__name__)
SYNC_S = 0.5
LEARNED_TTL_S = 24 * 3600.0
LOAD_TTL_S = 3.0
WARN_EVERY_S = 60.0

Learned = tuple[dict[str, DeploymentStats], dict[str, ModelStats], Ewma]
Loads = dict[str, Load]


def pack_learned(state: LearnedState) -> bytes:
    return msgspec.msgpack.encode((dict(state.deployments), dict(state.models), state.speed))


def unpack_learned(raw: bytes) -> LearnedState:
    deployments, models, speed = msgspec.msgpack.decode(raw, type=Learned)
    return LearnedState(deployments, models, speed)


class Replicas:
    """The sharing loop (module docstring) for one replica's router and fleet."""

    def __init__(self, router: Router, fleet: Fleet) -> None:
        self.router = router
        self.fleet = fleet
        self._warned_at = -WARN_EVERY_S

    async def run(self) -> None:
        if not self.router.store.shared_by_replicas:
            return
        while True:
            try:
                await self.sync()
            except (msgspec.DecodeError, msgspec.ValidationError) as exc:
                self._warn("replicas.unreadable", exc)  # a value of another turnout version
            await asyncio.sleep(SYNC_S)

    async def sync(self) -> None:
        """Publish this replica's learned state and load; take in the others'."""
        store, router = self.router.store, self.router
        await store.share("learned", pack_learned(router.own_learned), LEARNED_TTL_S)
        await store.share("load", msgspec.msgpack.encode(self.fleet.load()), LOAD_TTL_S)
        others = [unpack_learned(raw) for raw in await store.shared("learned")]
        router.learned = merge(router.own_learned, others)
        peers: Loads = {}
        for raw in await store.shared("load"):
            for backend, load in msgspec.msgpack.decode(raw, type=Loads).items():
                peers[backend] = peers.get(backend, Load()) + load
        self.fleet.peers = peers

    def _warn(self, event: str, exc: BaseException) -> None:
        now = time.monotonic()
        if now - self._warned_at >= WARN_EVERY_S:
            self._warned_at = now
            log.warning(event, error=str(exc))
