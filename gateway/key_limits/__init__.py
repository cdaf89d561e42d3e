"""Per-key limit counts behind one small async interface (``Counter``), for ``gateway.access``.

``MemoryCounter`` counts in this process (no ``state.url``); ``RedisCounter`` counts in Redis so that
replicas share the limits, always through ``ResilientCounter``, which counts locally while Redis is
away. One contract test suite runs against both counters (tests/gateway/test_access_limits.py).
"""

from gateway.key_limits.base import MAX_REQUEST_S, WINDOW_S, Counter, KeyUsage, Limit, Quota, Refusal
from gateway.key_limits.memory import MemoryCounter

__all__ = ["MAX_REQUEST_S", "WINDOW_S", "Counter", "KeyUsage", "Limit", "MemoryCounter", "Quota", "Refusal"]
