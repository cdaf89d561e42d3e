"""Shared routing state behind one small async interface: sessions, slot leases, the decision log.

``MemoryStore`` is the embedded default; ``RedisStore`` (``state.url``) shares the state between
gateway replicas. One contract test suite runs against both.
"""

from gateway.state.base import StateStore
from gateway.state.memory import MemoryStore
from gateway.state.prefix_index import SentPrompt

__all__ = ["MemoryStore", "SentPrompt", "StateStore"]
