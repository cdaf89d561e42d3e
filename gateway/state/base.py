"""The state interface. Every method is async so that a networked store fits behind it."""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Sequence
from typing import Any

from policies.types import SessionView, SlotLease


class StateStore(ABC):
    """Sessions (bounded, with a TTL), llama.cpp slot leases, and a bounded decision log."""

    @abstractmethod
    async def get_session(self, key: str) -> SessionView | None:
        """The session, if it is known and not expired."""

    @abstractmethod
    async def find_session(self, prefix_hashes: Sequence[str]) -> str | None:
        """The session whose last prompt is the longest of these conversation prefixes, if any."""

    @abstractmethod
    async def save_session(self, session: SessionView, prompt_hash: str | None) -> None:
        """Store ``session``; ``prompt_hash`` (its last prompt) will find it again."""

    @abstractmethod
    async def leases(self, backend_id: str) -> tuple[SlotLease, ...]:
        """The slots of ``backend_id`` held by sessions."""

    @abstractmethod
    async def claim_slot(
        self, backend_id: str, slot: int, session_key: str, now: float, expected_owner: str | None
    ) -> bool:
        """Give ``slot`` to ``session_key`` if its holder is still ``expected_owner`` (compare-and-set).

        A session holds at most one slot per backend: claiming another releases its old one.
        """

    @abstractmethod
    async def record_decision(self, entry: dict[str, Any]) -> None:
        """Append to the decision log (the oldest entries fall off)."""

    @abstractmethod
    async def decisions(self, limit: int) -> list[dict[str, Any]]:
        """The newest ``limit`` decision log entries, newest first."""
