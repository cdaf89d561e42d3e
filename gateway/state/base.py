"""The state interface. Every method is async so that a networked store fits behind it."""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Sequence
from typing import Any

from gateway.state.prefix_index import SentPrompt
from policies.prefix import PromptChain
from policies.types import PrefixMatch, SessionView, SlotLease


class StateStore(ABC):
    """Sessions (bounded, with a TTL), the prefix index, llama.cpp slot leases, a bounded decision log."""

    @abstractmethod
    async def get_session(self, key: str) -> SessionView | None:
        """The session, if it is known and not expired."""

    @abstractmethod
    async def find_session(self, chain: PromptChain) -> str | None:
        """The live session whose last recorded prompt is the longest byte prefix of ``chain``, if any."""

    @abstractmethod
    async def save_session(self, session: SessionView) -> None:
        """Store ``session``."""

    @abstractmethod
    async def record_prompt(self, sent: SentPrompt) -> None:
        """``sent`` was just processed by its engine: the prefix index learns what the backend, the
        slot (its checkpoints too) and the session hold."""

    @abstractmethod
    def launched(self, backend_id: str, slot: int | None, chain: PromptChain, tokens: int) -> None:
        """A request of ``chain`` (``tokens`` long) was sent to ``backend_id``, pinned to ``slot``
        (None: the engine picks one): the prefix index counts the slots it saved to the RAM cache
        (``PrefixIndex.launched``)."""

    @abstractmethod
    async def match_prefix(self, chain: PromptChain, backend_ids: Sequence[str]) -> dict[str, PrefixMatch]:
        """What each backend holds of ``chain``, per slot and among its recent prompts."""

    @abstractmethod
    async def leases(self, backend_id: str) -> tuple[SlotLease, ...]:
        """The slots of ``backend_id`` held by sessions."""

    @abstractmethod
    async def claim_slot(
        self,
        backend_id: str,
        slot: int,
        session_key: str,
        now: float,
        expected_owner: str | None,
        tokens: int = 0,
    ) -> bool:
        """Give ``slot`` to ``session_key`` if its holder is still ``expected_owner`` (compare-and-set).

        A session holds at most one slot per backend: claiming another releases its old one.
        ``tokens`` is the prompt it sends there (what an eviction would cost it).
        """

    @abstractmethod
    async def forget_backend(self, backend_id: str) -> None:
        """The engine restarted: it holds nothing turnout sent it. Its slot leases and what the
        prefix index says it holds go (the sessions stay, and are placed afresh)."""

    @abstractmethod
    async def release_slots(self, session_key: str) -> list[tuple[str, int]]:
        """Drop every slot lease the session holds (its next turn is placed afresh); (backend, slot) each."""

    @abstractmethod
    async def sessions(self, limit: int) -> list[SessionView]:
        """The live sessions, most recently seen first."""

    @abstractmethod
    async def record_turn(self, key: str, turn: dict[str, Any]) -> None:
        """Append one turn to the session's timeline (bounded; forgotten with the session)."""

    @abstractmethod
    async def turns(self, key: str) -> list[dict[str, Any]]:
        """The session's timeline, oldest turn first."""

    async def finish_turn(
        self, session: SessionView | None, turn: dict[str, Any] | None, decision: dict[str, Any]
    ) -> None:
        """A finished request's writes: the session's new state and timeline entry, and the decision
        (one round trip where the store can batch them)."""
        if session is not None:
            await self.save_session(session)
            if turn is not None:
                await self.record_turn(session.key, turn)
        await self.record_decision(decision)

    @abstractmethod
    async def save_policy(self, policy: dict[str, Any]) -> None:
        """The live policy an admin set (profile, drained backends, when), for every replica."""

    @abstractmethod
    async def policy(self) -> dict[str, Any] | None:
        """The live policy, if an admin ever set one."""

    @abstractmethod
    async def record_decision(self, entry: dict[str, Any]) -> None:
        """Append to the decision log (the oldest entries fall off)."""

    @abstractmethod
    async def decisions(self, limit: int) -> list[dict[str, Any]]:
        """The newest ``limit`` decision log entries, newest first."""

    # Replicas. A store one process keeps to itself has no one to share with: these do nothing.

    shared_by_replicas = False

    async def follow(self) -> None:
        """Learn what the other replicas record in the prefix index, until cancelled (a background
        task); returns at once when there are none."""
        return

    async def share(self, kind: str, value: bytes, ttl_s: float) -> None:
        """Publish this replica's ``kind`` (its learned state, its load) for the others, to be
        forgotten ``ttl_s`` after the last publication (a replica that died stops counting)."""
        return

    async def shared(self, kind: str) -> list[bytes]:
        """What the other live replicas published as ``kind``."""
        return []
