"""In-memory state: the embedded default for one gateway process."""

from __future__ import annotations

import itertools
import time
from collections import OrderedDict, deque
from collections.abc import Callable, Sequence
from typing import Any

from gateway.state.base import StateStore
from gateway.state.prefix_index import PrefixIndex, SentPrompt
from policies.prefix import PromptChain
from policies.types import PrefixMatch, SessionView, SlotLease

MAX_TURNS = 500
"""Turns kept per session timeline (the newest)."""
TIMELINE_TURNS = 20_000
"""Turns kept across every session's timeline (about 0.5 KB each): past it, the oldest turns of the
session that went longest without one go first. Without it the bound was ``max_sessions * MAX_TURNS``,
gigabytes at the defaults."""


class MemoryStore(StateStore):
    """Sessions in an LRU with a TTL, the prefix index, slot leases and a ring of decisions."""

    def __init__(
        self,
        *,
        max_sessions: int = 10_000,
        session_ttl_s: float = 6 * 3600,
        max_decisions: int = 1000,
        prefix_tokens_per_backend: int = 1_000_000,
        timeline_turns: int = TIMELINE_TURNS,
        clock: Callable[[], float] = time.time,
    ) -> None:
        self._sessions: OrderedDict[str, SessionView] = OrderedDict()
        self.index = PrefixIndex(max_tokens_per_backend=prefix_tokens_per_backend, max_tips=4 * max_sessions)
        self._leases: dict[str, dict[int, SlotLease]] = {}
        self._decisions: deque[dict[str, Any]] = deque(maxlen=max_decisions)
        self._turns: OrderedDict[str, deque[dict[str, Any]]] = OrderedDict()  # least recent turn first
        self._turn_count = 0
        self._timeline_turns = timeline_turns
        self._policy: dict[str, Any] | None = None
        self._max_sessions = max_sessions
        self._ttl = session_ttl_s
        self._clock = clock

    async def get_session(self, key: str) -> SessionView | None:
        session = self._sessions.get(key)
        if session is None:
            return None
        if self._clock() - session.last_seen > self._ttl:
            del self._sessions[key]
            self._drop_turns(key)
            return None
        self._sessions.move_to_end(key)
        return session

    async def find_session(self, chain: PromptChain) -> str | None:
        key = self.index.find_session(chain)
        return key if key is not None and await self.get_session(key) is not None else None

    async def save_session(self, session: SessionView) -> None:
        self._sessions[session.key] = session
        self._sessions.move_to_end(session.key)
        while len(self._sessions) > self._max_sessions:
            dropped, _ = self._sessions.popitem(last=False)
            self._drop_turns(dropped)

    async def record_prompt(self, sent: SentPrompt) -> None:
        self.index.record(sent)

    def launched(self, backend_id: str, slot: int | None, chain: PromptChain, tokens: int) -> None:
        self.index.launched(backend_id, slot, chain, tokens)

    async def match_prefix(self, chain: PromptChain, backend_ids: Sequence[str]) -> dict[str, PrefixMatch]:
        return {backend: self.index.match(chain, backend) for backend in backend_ids}

    async def leases(self, backend_id: str) -> tuple[SlotLease, ...]:
        return tuple(sorted(self._leases.get(backend_id, {}).values(), key=lambda lease: lease.slot))

    async def claim_slot(
        self,
        backend_id: str,
        slot: int,
        session_key: str,
        now: float,
        expected_owner: str | None,
        tokens: int = 0,
    ) -> bool:
        slots = self._leases.setdefault(backend_id, {})
        holder = slots.get(slot)
        if (holder.session_key if holder else None) not in (expected_owner, session_key):
            return False
        for other, lease in list(slots.items()):
            if lease.session_key == session_key and other != slot:
                del slots[other]
        slots[slot] = SlotLease(slot, session_key, now, tokens)
        return True

    def set_lease(self, backend_id: str, slot: int, session_key: str, now: float, tokens: int) -> None:
        """Record a lease decided elsewhere (the shared store): the session's other slot there goes."""
        slots = self._leases.setdefault(backend_id, {})
        for other, lease in list(slots.items()):
            if lease.session_key == session_key and other != slot:
                del slots[other]
        slots[slot] = SlotLease(slot, session_key, now, tokens)

    async def forget_backend(self, backend_id: str) -> None:
        self._leases.pop(backend_id, None)
        self.index.forget(backend_id)

    async def release_slots(self, session_key: str) -> list[tuple[str, int]]:
        released = []
        for backend_id, slots in self._leases.items():
            for slot, lease in list(slots.items()):
                if lease.session_key == session_key:
                    del slots[slot]
                    released.append((backend_id, slot))
        return released

    async def sessions(self, limit: int) -> list[SessionView]:
        now = self._clock()
        live = (s for s in reversed(self._sessions.values()) if now - s.last_seen <= self._ttl)
        return list(itertools.islice(live, limit))

    async def record_turn(self, key: str, turn: dict[str, Any]) -> None:
        turns = self._turns.get(key)
        if turns is None:
            turns = self._turns[key] = deque(maxlen=MAX_TURNS)
        else:
            self._turns.move_to_end(key)
        self._turn_count += len(turns) < MAX_TURNS  # a full deque drops its oldest as it appends
        turns.append(turn)
        while self._turn_count > self._timeline_turns:
            oldest_key, oldest = next(iter(self._turns.items()))
            oldest.popleft()
            self._turn_count -= 1
            if not oldest:
                del self._turns[oldest_key]

    def _drop_turns(self, key: str) -> None:
        self._turn_count -= len(self._turns.pop(key, ()))

    async def turns(self, key: str) -> list[dict[str, Any]]:
        return list(self._turns.get(key, ()))

    async def save_policy(self, policy: dict[str, Any]) -> None:
        self._policy = dict(policy)

    async def policy(self) -> dict[str, Any] | None:
        return None if self._policy is None else dict(self._policy)

    async def record_decision(self, entry: dict[str, Any]) -> None:
        self._decisions.append(entry)

    async def decisions(self, limit: int) -> list[dict[str, Any]]:
        return list(reversed(self._decisions))[:limit]
