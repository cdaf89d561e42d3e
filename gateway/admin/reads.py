"""What the admin pages show: read-only views of the fleet, the router, the sessions and the decision
log (``AdminReads``; ``gateway.admin.service.AdminService`` adds the actions)."""

from __future__ import annotations

from collections import deque
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import asdict, dataclass
from typing import Any

import structlog

from backends.load import Load
from gateway.admin import accuracy, bought, slots, whatif
from gateway.admin.auth import AdminAuth
from gateway.admin.learned import learned_row
from gateway.api.service import WhatIfEdits
from gateway.core import Core
from gateway.decisions import session_name
from policies import BUILTIN_PROFILES
from policies.sessions import session_label
from policies.types import EngineKind, SessionView

log = structlog.get_logger(__name__)

AUDIT_SIZE = 500
WINDOWS_S = (300, 3600)
BOUGHT_S = 24 * 3600
"""What routing bought is summed over the last day (of what the decision log keeps)."""
DECISION_FILTERS = ("model", "backend", "session", "status")


@dataclass(frozen=True, slots=True)
class AuditEvent:
    at: float
    who: str
    client: str
    action: str
    detail: str


class AdminReads:
    """The admin's read-only views, on one gateway's core."""

    def __init__(self, core: Core, auth: AdminAuth) -> None:
        self.core = core
        self.settings = core.settings
        self.auth = auth
        self.audit: deque[AuditEvent] = deque(maxlen=AUDIT_SIZE)
        self.applied_at = 0.0  # when the live policy this replica follows was set
        path = core.settings.record.path
        self.whatifs = whatif.WhatIf(path) if path is not None else None

    @property
    def profiles(self) -> list[str]:
        return sorted({*BUILTIN_PROFILES, *(p.name for p in self.settings.profiles)})

    def _session_row(self, session: SessionView) -> dict[str, Any]:
        return {
            "session": session_label(session.key),
            "name": self._name(session.key),
            "source": session.source,
            "turns": session.turns,
            "backend": session.backend_id,
            "slot": session.slot,
            "last_prompt_tokens": session.prompt_tokens,
            "total_prompt_tokens": session.total_prompt_tokens,
            "total_cached_tokens": session.total_cached_tokens,
            "saved_s": round(session.saved_s, 2),
            "first_seen": session.first_seen,
            "last_seen": session.last_seen,
        }

    def _name(self, key: str | None) -> str | None:
        return session_name(key, redact=self.settings.admin.redact_session_ids)

    async def _session_bysession_label(self, label: str) -> SessionView | None:
        """The live session with this label (the hash) or, unless redacted, this name when one live
        session alone has it (``h:bob`` and ``u:bob`` are both ``bob``: then only their hashes do)."""
        sessions = await self.core.router.store.sessions(self.settings.state.max_sessions)
        for session in sessions:
            if session_label(session.key) == label:
                return session
        named = [s for s in sessions if self._name(s.key) == label]
        return named[0] if len(named) == 1 else None

    async def sessions(self, limit: int, *, query: str = "", min_turns: int = 0) -> dict[str, Any]:
        """The live sessions, most recent first, with at least ``min_turns`` turns and ``query`` in
        their name or hash (the first ``limit`` of those), and how many others were left out."""
        rows = [
            self._session_row(s)
            for s in await self.core.router.store.sessions(self.settings.state.max_sessions)
        ]
        needle = query.strip().lower()
        kept = [
            row
            for row in rows
            if row["turns"] >= min_turns
            and (not needle or needle in row["session"] or needle in (row["name"] or "").lower())
        ]
        return {"data": kept[:limit], "live": len(rows), "hidden": len(rows) - len(kept)}

    async def session(self, label: str) -> dict[str, Any] | None:
        session = await self._session_bysession_label(label)
        if session is None:
            return None
        store = self.core.router.store
        turns = await store.turns(session.key)
        holds = [
            {"backend": backend.id, "slot": lease.slot}
            for backend in self.settings.backends
            for lease in await store.leases(backend.id)
            if lease.session_key == session.key
        ]
        return {**self._session_row(session), "holds": holds, "timeline": turns}

    async def _log(self) -> list[dict[str, Any]]:
        """The decision log, newest first, as every view reads it: with names redacted when
        ``admin.redact_session_ids`` is set (entries logged before it was set too)."""
        entries = await self.core.router.store.decisions(self.settings.state.decision_log_size)
        return [_redacted(e) for e in entries] if self.settings.admin.redact_session_ids else entries

    async def decisions(self, limit: int, filters: Mapping[str, str]) -> list[dict[str, Any]]:
        entries = await self._log()
        wanted = {k: v for k, v in filters.items() if k in DECISION_FILTERS and v}
        out = [e for e in entries if _matches(e, wanted)]
        return out[:limit]

    async def decision(self, request_id: str) -> dict[str, Any] | None:
        entries = await self._log()
        return next((e for e in entries if e["request_id"] == request_id), None)

    async def overview(self, with_bought: bool = False) -> dict[str, Any]:
        """The backends now; ``with_bought``: and what routing bought (:meth:`bought`), from the same
        read of the decision log (the page renders it once; its 2-second refresh leaves it out)."""
        router, fleet = self.core.router, self.core.fleet
        entries = await self._log()
        now = self.core.router.clock.time()
        backends = []
        in_flight, asleep = fleet.load(), router.asleep()
        for snapshot in fleet.snapshots():
            leases = {lease.slot: lease for lease in await router.store.leases(snapshot.backend_id)}
            slots = [
                {
                    "id": slot.id,
                    "n_ctx": slot.n_ctx,
                    "busy": slot.is_processing,
                    "session": session_label(leases[slot.id].session_key) if slot.id in leases else None,
                    "session_name": self._name(leases[slot.id].session_key) if slot.id in leases else None,
                    "tokens": leases[slot.id].tokens if slot.id in leases else 0,
                    "idle_s": round(now - leases[slot.id].last_used, 1) if slot.id in leases else None,
                }
                for slot in snapshot.slots
            ]
            backends.append(
                {
                    "id": snapshot.backend_id,
                    "kind": snapshot.kind.value,
                    "health": snapshot.health.value,
                    "error": snapshot.error,
                    "warnings": list(snapshot.warnings),
                    "drained": snapshot.backend_id in router.drained,
                    "asleep": asleep.get(snapshot.backend_id),
                    "circuit": snapshot.circuit,
                    "models": [d.model for d in snapshot.deployments],
                    "running": snapshot.running,
                    "queued": snapshot.queued,
                    "in_flight": in_flight.get(snapshot.backend_id, Load()).running,
                    "leases": [
                        {
                            "slot": lease.slot,
                            "session": session_label(lease.session_key),
                            "session_name": self._name(lease.session_key),
                        }
                        for lease in leases.values()
                    ],
                    "kv_usage": snapshot.kv_usage,
                    "slots": slots,
                    "learned": [
                        learned_row(d.model, router.learned.for_deployment(d, snapshot.kind), snapshot.kind)
                        for d in snapshot.deployments
                    ],
                    "activity": {
                        f"{window // 60}m": _activity(entries, snapshot.backend_id, now - window, window)
                        for window in WINDOWS_S
                    },
                }
            )
        out = {"profile": router.profile.name, "backends": backends, "at": now}
        return {**out, "bought": self._bought(entries, now)} if with_bought else out

    async def bought(self) -> dict[str, Any]:
        """What routing saved over the last day against each backend alone (``gateway.admin.bought``)."""
        entries = await self._log()
        return self._bought(entries, self.core.router.clock.time())

    def _bought(self, entries: Sequence[Mapping[str, Any]], now: float) -> dict[str, Any]:
        spent = bought.bought(entries, now - BOUGHT_S, now)
        return {**spent, "log_from": self._cut(entries, now - BOUGHT_S)}

    def _cut(self, entries: Sequence[Mapping[str, Any]], since: float) -> float | None:
        """When the decision log starts, if it is full and starts after ``since`` (older decisions
        were dropped: a view of the window misses them)."""
        full = len(entries) >= self.settings.state.decision_log_size
        return float(entries[-1]["at"]) if full and entries and entries[-1]["at"] > since else None

    async def series(self, minutes: int) -> dict[str, Any]:
        """Per backend: each request's predicted and actual TTFT where both are known (a streamed
        answer's; not a whole body's, which has no first token, nor a token count's), and the
        cache-hit ratio per minute."""
        entries = await self._log()
        since = self.core.router.clock.time() - minutes * 60
        out: dict[str, Any] = {}
        for entry in reversed(entries):  # oldest first
            outcome, backend = entry.get("outcome"), entry.get("chosen")
            if not outcome or backend is None or entry["at"] < since:
                continue
            chosen: dict[str, Any] = next((c for c in entry["candidates"] if c["backend"] == backend), {})
            line = out.setdefault(backend, {"ttft": [], "cache": {}})
            predicted, actual = chosen.get("predicted_ttft_s"), outcome.get("ttft_s")
            if predicted is not None and actual is not None:  # only what was measured: a whole body
                line["ttft"].append([round(entry["at"], 3), predicted, actual])  # or a count has no TTFT
            minute = int(entry["at"] // 60 * 60)
            hit = line["cache"].setdefault(minute, [0, 0])
            hit[0] += outcome.get("cached_tokens") or 0
            hit[1] += outcome.get("prompt_tokens") or 0
        for line in out.values():
            line["cache"] = [
                [m, round(c / p, 4) if p else None] for m, (c, p) in sorted(line["cache"].items())
            ]
        return {"minutes": minutes, "backends": out}

    async def predictions(self, minutes: int, slices: int = 12) -> dict[str, Any]:
        """Per backend: how far the predicted TTFTs were from the actual ones over the last
        ``minutes`` (``gateway.admin.accuracy``), beside what learning corrected of the priors."""
        router = self.core.router
        entries = await self._log()
        now = router.clock.time()
        since = now - minutes * 60
        found = accuracy.pairs(entries, since)
        backends = []
        for snapshot in self.core.fleet.snapshots():
            learned = [learned_row(d.model, router.learned.for_deployment(d, snapshot.kind), snapshot.kind)
                       for d in snapshot.deployments]  # fmt: skip
            stats = accuracy.summary(found.get(snapshot.backend_id, []), since, now, slices)
            backends.append(
                {"id": snapshot.backend_id, "kind": snapshot.kind.value, **stats, "learned": learned}
            )
        return {"minutes": minutes, "backends": backends}

    async def slots(self, minutes: int) -> dict[str, Any]:
        """The slot timeline over the last ``minutes`` (``gateway.admin.slots``): per llama.cpp
        backend a lane per slot, per vLLM backend a lane of its running and waiting requests."""
        router, fleet = self.core.router, self.core.fleet
        entries = await self._log()
        now = router.clock.time()
        since = now - minutes * 60
        backends: list[dict[str, Any]] = []
        for snapshot in fleet.snapshots():
            backend: dict[str, Any] = {"id": snapshot.backend_id, "kind": snapshot.kind.value}
            if snapshot.kind is EngineKind.LLAMACPP:
                backend["lanes"] = slots.llama_lanes(
                    entries, snapshot.backend_id, snapshot.total_slots, since, now
                )
            elif snapshot.kind is EngineKind.VLLM:
                backend["load"] = slots.load_lane(fleet.history.since(snapshot.backend_id, since), since, now)
            backends.append(backend)
        return {
            "minutes": minutes,
            "since": round(since, 3),
            "now": round(now, 3),
            "width": slots.WIDTH_PX,
            "bucket_s": fleet.history.bucket_s,
            "windows": slots.WINDOWS_MIN,
            "ticks": slots.ticks(since, now),
            "log_from": self._cut(entries, since),
            "backends": backends,
        }

    def whatif_form(self) -> dict[str, Any]:
        """What the what-if page offers: the recording, the backends as the replay would simulate
        them, the profiles it replays under."""
        config = whatif.fleet(self.settings, self.core.fleet.snapshots(), WhatIfEdits())
        windows: dict[str, int | None] = {}
        for model in config["models"]:
            for deployment in model["deployments"]:
                windows.setdefault(deployment["backend"], deployment.get("context_window"))
        return {
            "recording": str(self.whatifs.recording) if self.whatifs else None,
            "recording_now": self.core.router.recorder is not None,
            "profiles": self.profiles,
            "backends": [
                {
                    "id": b["id"],
                    "kind": b["kind"],
                    "slots": b.get("sim", {}).get("slots"),
                    "window": windows.get(b["id"]),
                }
                for b in config["backends"]
            ],
            "max_minutes": whatif.MAX_MINUTES,
        }

    async def whatif(self, edits: WhatIfEdits) -> dict[str, Any]:
        """The recording's last ``edits.minutes`` replayed under every profile on the edited fleet
        (``gateway.admin.whatif``)."""
        if self.whatifs is None:
            raise whatif.WhatIfError(
                "no recording: set [record] path (docs/replay.md) and record some traffic"
            )
        config = whatif.fleet(self.settings, self.core.fleet.snapshots(), edits)
        log.info("admin.whatif", minutes=edits.minutes, remove=edits.remove, copies=edits.copies)
        return await self.whatifs.run(config, edits, self.profiles)

    def policy(self) -> dict[str, Any]:
        router = self.core.router
        profile = router.profile
        return {
            "profile": profile.name,
            "filters": list(profile.filters),
            "scorers": dict(profile.scorers),
            "profiles": self.profiles,
            "backends": [{"id": b.id, "drained": b.id in router.drained} for b in self.settings.backends],
            "record": {
                "path": str(self.settings.record.path) if self.settings.record.path else None,
                "on": router.recorder is not None,
            },
            "groups": [
                {
                    "name": g.name,
                    "members": list(g.ordered),
                    "pinned": router.pins.get(g.name),
                    "profile": g.profile or router.profile.name,
                }
                for g in self.settings.groups
            ],
            "residency": self.core.residency.view(),
            "audit": [asdict(e) for e in self.audit],
        }


def _matches(entry: Mapping[str, Any], wanted: Mapping[str, str]) -> bool:
    for key, value in wanted.items():
        if key == "session":  # its label (the hash) or the name the client gave it
            if value not in (entry.get("session"), entry.get("session_name")):
                return False
            continue
        field = "chosen" if key == "backend" else key
        if str(entry.get(field)) != value:
            return False
    return True


def _activity(
    entries: Iterable[Mapping[str, Any]], backend: str, since: float, window: int
) -> dict[str, Any]:
    """Requests per minute, TTFT p50/p90 and cache-hit ratio of ``backend`` since ``since``, from the
    decision log (which keeps the newest ``state.decision_log_size`` decisions)."""
    done = [e["outcome"] for e in entries if e["chosen"] == backend and e["at"] >= since and e.get("outcome")]
    ttfts: Sequence[float] = [o["ttft_s"] for o in done if o.get("ttft_s") is not None]
    prompt = sum(o["prompt_tokens"] or 0 for o in done)
    cached = sum(o["cached_tokens"] or 0 for o in done)
    p50, p90 = accuracy.percentile(ttfts, 0.5), accuracy.percentile(ttfts, 0.9)
    return {
        "requests_per_min": round(len(done) / (window / 60), 2),
        "ttft_p50_s": None if p50 is None else round(p50, 3),
        "ttft_p90_s": None if p90 is None else round(p90, 3),
        "cache_hit": round(cached / prompt, 3) if prompt else None,
    }


def _redacted(entry: Mapping[str, Any]) -> dict[str, Any]:
    """A decision entry without the names clients gave sessions (one logged before
    ``admin.redact_session_ids`` was set may have them): each shown as its label instead."""
    names = {c["evicts_name"]: c["evicts"] for c in entry.get("candidates", ()) if c.get("evicts_name")}

    def label(text: str) -> str:
        for name, hashed in names.items():
            text = text.replace(f"session {name}", f"session {hashed}")
        return text

    candidates = [
        {**c, "evicts_name": None, "note": label(c.get("note", ""))} for c in entry.get("candidates", ())
    ]
    return {
        **entry,
        "session_name": None,
        "reason": label(entry.get("reason") or ""),
        "candidates": candidates,
    }
