"""Shared routing state behind one small async interface: sessions, slot leases, the decision log.

``MemoryStore`` is the embedded default; a Redis store for several gateway replicas is to implement
the same interface, with one contract test suite run against every implementation.
"""

from gateway.state.base import StateStore
from gateway.state.memory import MemoryStore

__all__ = ["MemoryStore", "StateStore"]
