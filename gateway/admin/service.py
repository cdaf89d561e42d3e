"""What the admin pages do: the few actions (switch profile, drain and undrain a backend, pin a model
group to one member, switch a residency set's GPUs, start and stop recording, release a session's
slot), each written to an audit
log, and the live policy shared with the other replicas. What they show is ``AdminReads``
(``gateway.admin.reads``)."""

from __future__ import annotations

import asyncio
from typing import Any

import structlog

from gateway.admin.auth import Identity
from gateway.admin.reads import DECISION_FILTERS as DECISION_FILTERS
from gateway.admin.reads import AdminReads, AuditEvent
from gateway.decisions import session_shown
from gateway.residency_state import SwitchBusy, UnknownMember

log = structlog.get_logger(__name__)

POLICY_POLL_S = 0.5


class AdminError(ValueError):
    """An action that cannot be done as asked (unknown profile or backend); the message says why."""


class UnknownGroup(AdminError):
    """A pin of a model group that is not configured."""


class UnknownResidency(AdminError):
    """A switch of a residency set, or to a member, that is not configured."""


class ResidencyBusy(AdminError):
    """A switch of that residency set is already running."""


class AdminService(AdminReads):
    """The admin's views and actions, on one gateway's core."""

    def _record(self, identity: Identity, action: str, detail: str) -> None:
        event = AuditEvent(self.core.router.clock.time(), identity.who, identity.client, action, detail)
        self.audit.appendleft(event)
        log.info("admin.action", who=event.who, client=event.client, action=action, detail=detail)

    # actions

    async def switch_profile(self, name: str, identity: Identity) -> None:
        if name not in self.profiles:
            raise AdminError(f"unknown profile {name!r}; known: {', '.join(self.profiles)}")
        router = self.core.router
        before = router.profile.name
        router.profile = self.settings.routing_profile(name)
        self._record(identity, "switch-profile", f"{before} -> {name}")
        await self._share()

    async def drain(self, backend_id: str, drained: bool, identity: Identity) -> None:
        known = [b.id for b in self.settings.backends]
        if backend_id not in known:
            raise AdminError(f"unknown backend {backend_id!r}; known: {', '.join(known)}")
        router = self.core.router
        router.drained = router.drained | {backend_id} if drained else router.drained - {backend_id}
        self._record(identity, "drain" if drained else "undrain", backend_id)
        await self._share()

    async def pin(self, group: str, member: str | None, identity: Identity) -> None:
        """Send ``group``'s requests to ``member`` only (conversations on another member move); None:
        its members are chosen per request again."""
        groups = {g.name: g for g in self.settings.groups}
        if group not in groups:
            raise UnknownGroup(f"unknown model group {group!r}; known: {', '.join(groups) or 'none'}")
        if member is not None and member not in groups[group].members:
            raise AdminError(
                f"{member!r} is not a member of {group}; members: {', '.join(groups[group].members)}"
            )
        router = self.core.router
        if member is None:
            router.pins.pop(group, None)
        else:
            router.pins[group] = member
        self._record(identity, "pin" if member else "unpin", f"{group} -> {member}" if member else group)
        await self._share()

    def switch_residency(self, name: str, target: str, identity: Identity) -> dict[str, Any]:
        """Start moving residency set ``name``'s GPUs to ``target`` (``gateway.residency``); the
        switch's record, as it starts."""
        try:
            switch = self.core.residency.start(name, target, identity.who)
        except UnknownMember as exc:
            raise UnknownResidency(str(exc)) from exc
        except SwitchBusy as exc:
            raise ResidencyBusy(str(exc)) from exc
        self._record(identity, "residency-switch", f"{name}: {switch.source} -> {target}")
        return switch.view()

    def record(self, on: bool, identity: Identity) -> None:
        """Start or stop writing answered requests to ``record.path`` (this replica's own file)."""
        config, router = self.settings.record, self.core.router
        if config.path is None:
            raise AdminError("set record.path in the config to record traffic")
        if on and router.recorder is None:
            router.recorder = config.recorder()
        elif not on and router.recorder is not None:
            router.recorder.close()
            router.recorder = None
        self._record(identity, "record" if on else "stop-recording", str(config.path))

    async def _share(self) -> None:
        """Every replica applies it within ``POLICY_POLL_S`` (``follow_policy``)."""
        router = self.core.router
        self.applied_at = self.core.router.clock.time()
        policy = {
            "profile": router.profile.name,
            "drained": sorted(router.drained),
            "pins": dict(sorted(router.pins.items())),
            "changed_at": self.applied_at,
        }
        await router.store.save_policy(policy)

    async def follow_policy(self) -> None:
        """Apply the live policy another replica set (polled every ``POLICY_POLL_S``)."""
        while True:
            await asyncio.sleep(POLICY_POLL_S)
            try:
                policy = await self.core.router.store.policy()
            except Exception as exc:  # a store hiccup must not end the loop
                log.warning("admin.policy_poll_failed", error=str(exc))
                continue
            if policy is None or policy["changed_at"] <= self.applied_at:
                continue
            self.applied_at = policy["changed_at"]
            router = self.core.router
            if policy["profile"] in self.profiles:
                router.profile = self.settings.routing_profile(policy["profile"])
            router.drained = frozenset(
                b for b in policy["drained"] if b in {x.id for x in self.settings.backends}
            )
            groups = {g.name: g.members for g in self.settings.groups}
            router.pins = {
                g: m for g, m in policy.get("pins", {}).items() if m in groups.get(g, ())
            }  # a policy saved before pins existed has none
            log.info(
                "admin.policy_followed",
                profile=policy["profile"],
                drained=policy["drained"],
                pins=router.pins,
            )

    async def release(self, label: str, identity: Identity) -> list[tuple[str, int]]:
        session = await self._session_bysession_label(label)
        if session is None:
            raise AdminError(f"no live session {label}")
        released = await self.core.router.store.release_slots(session.key)
        slots = ", ".join(f"{b} slot {s}" for b, s in released) or "none held"
        shown = session_shown(session.key, redact=self.settings.admin.redact_session_ids)
        self._record(identity, "release-slot", f"session {shown}: {slots}")
        return released
