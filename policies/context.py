"""What routing knows beyond the request and the snapshots (``RoutingContext``): the session, slot
leases, what each backend holds of the prompt, learning, and an admin's drains and pins. The gateway
gathers it per decision (``gateway.routing``); every stage of ``policies.route`` reads it."""

from __future__ import annotations

from collections.abc import Mapping
from types import MappingProxyType

import msgspec

from policies.coming import NextTurn
from policies.learning import LearnedState
from policies.ledger import RouterView
from policies.slots import DEFAULT_LEASE_IDLE_S
from policies.types import PrefixMatch, SessionView, SlotLease


class RoutingContext(msgspec.Struct, frozen=True):
    """What routing knows beyond the request and the snapshots: the session, slot leases, what each
    backend holds of the prompt (the prefix index), learning."""

    session: SessionView | None = None
    leases: Mapping[str, tuple[SlotLease, ...]] = msgspec.field(default_factory=lambda: MappingProxyType({}))
    learned: LearnedState = msgspec.field(default_factory=LearnedState)
    sequence: int = 0  # a request counter, for round-robin
    matches: Mapping[str, PrefixMatch] = msgspec.field(default_factory=lambda: MappingProxyType({}))
    lease_idle_s: float = DEFAULT_LEASE_IDLE_S
    drained: frozenset[str] = frozenset()  # backends an admin drained: no new requests
    asleep: Mapping[str, str] = msgspec.field(default_factory=lambda: MappingProxyType({}))
    """Backend -> why it cannot take a request now: a member of a residency set that is not awake
    (asleep, or being freed or woken by a switch: ``gateway.residency``)."""
    live_sessions: int = 0  # sessions that sent a turn within ``lease_idle_s``, this one included
    homes: Mapping[str, int] = msgspec.field(default_factory=lambda: MappingProxyType({}))
    """Backend -> the other active sessions at home there: a turn in flight there, or one that ended
    there seconds ago (``gateway.live.Homes``; this request's session not counted). ``policies.homes``
    reads it: a llama-server with more of them than slots is crowded."""
    coming: Mapping[str, tuple[NextTurn, ...]] = msgspec.field(default_factory=lambda: MappingProxyType({}))
    """Backend -> the next turns of the other sessions at home there (``gateway.live.Homes``): the
    prompts an answer decoding there is expected to wait for (``policies.coming``)."""
    follow_rate: float = 0.0
    """The chance a conversation known only by its content comes back after its first turn (learned
    by the gateway per prompt family: ``gateway.live.FollowUps``); weighs a first turn's look-ahead
    while a slot is free."""
    pins: Mapping[str, str] = msgspec.field(default_factory=lambda: MappingProxyType({}))
    """Model group -> the one member an admin pinned it to (its other members get no requests)."""
    routers: Mapping[str, RouterView] = msgspec.field(default_factory=lambda: MappingProxyType({}))
    """Backend -> what the router's own traffic tells of it (``policies.ledger``: the published
    routers' profiles read it)."""
