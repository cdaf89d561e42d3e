"""The gateway's side of routing: sessions and slot leases from the store, learned state.

``Router.route`` is the one call a request makes: its session (named, or found by the prefix
index), the engine's count near a window, then ``Router.decide``, which gathers what the pure
``policies.route`` needs (session, leases, learned state), routes, and claims the chosen llama.cpp
slot. What a finished request teaches comes back through the completion pipeline
(``gateway.completion``), which calls ``Router.absorb``.
"""

from __future__ import annotations

import itertools
from collections.abc import Callable, Mapping
from types import MappingProxyType
from typing import Any

import structlog
from msgspec.structs import replace

from backends.clock import Clock
from backends.fleet import Fleet
from gateway.decisions import moved
from gateway.live import FollowUps, Homes, LiveSessions
from gateway.refusals import too_long_everywhere
from gateway.routed import Routed
from gateway.router_views import RouterHistory
from gateway.state import StateStore
from gateway.traffic import TrafficRecorder
from policies import Endpoint, Profile, RequestFeatures, route
from policies.context import RoutingContext
from policies.decision import Outcome
from policies.features import MESSAGE_OVERHEAD_TOKENS
from policies.learning import LearnedState, learn, learn_prefill
from policies.prefix import PromptChain
from policies.sessions import session_label
from policies.slots import DEFAULT_LEASE_IDLE_S, proven
from policies.types import (
    Deployment,
    EngineKind,
    Health,
    PrefixMatch,
    SessionSource,
    SessionView,
    SlotLease,
    SlotMatch,
)

MESSAGE_START = 0x1E  # policies.prefix.render puts this byte before every message
SEPARATORS = b"\x1c\x1d\x1e\x1f"  # render's field separators: not part of what the engine counts

log = structlog.get_logger(__name__)
CLAIM_ATTEMPTS = 3
NEAR_LIMIT = 0.5  # count exactly when the estimate is within 50% of a candidate's window ...
NEAR_LIMIT_LEARNED = 0.1  # ... or within 10% once the model's characters per token were measured
MIN_COUNTED_PROMPT = 512


def added_part(features: RequestFeatures, session: SessionView) -> bytes | None:
    """What this prompt adds to its session's last one (canonical bytes), when it extends it and the
    engine's count of that one is known; None otherwise."""
    previous = session.prompt
    if previous is None or not session.prompt_tokens or not features.chain.extends(previous):
        return None
    return features.chain.stream[previous.length :]


def remembered_slot(
    matches: Mapping[str, PrefixMatch],
    session: SessionView | None,
    leases: Mapping[str, tuple[SlotLease, ...]],
    chain: PromptChain,
) -> Mapping[str, PrefixMatch]:
    """What the session's own slot holds, when this replica's prefix index does not know: another
    replica (or this one before a restart) sent the session's last prompt there, the shared store says
    the session still holds the slot, and this prompt extends that one."""
    if session is None or session.slot is None or session.prompt is None or session.backend_id is None:
        return matches
    backend, slot = session.backend_id, session.slot
    match = matches.get(backend)
    held_by = {lease.slot: lease.session_key for lease in leases.get(backend, ())}
    if match is None or held_by.get(slot) != session.key:
        return matches
    if match.slot(slot).held or not chain.extends(session.prompt):
        return matches
    remembered = SlotMatch(slot, session.prompt_tokens, whole=True, held=session.prompt_tokens)
    slots = (*(m for m in match.slots if m.slot != slot), remembered)
    return {**matches, backend: replace(match, slots=slots)}


class Router:
    def __init__(
        self,
        fleet: Fleet,
        store: StateStore,
        profile: Profile,
        *,
        lease_idle_s: float = DEFAULT_LEASE_IDLE_S,
        group_profiles: Mapping[str, Profile] | None = None,
        redact_session_ids: bool = False,
    ) -> None:
        self.fleet = fleet
        self.clock: Clock = fleet.clock
        """What routing, leases, sessions and the decision log read as now: the fleet's clock."""
        self.store = store
        self.profile = profile
        self.group_profiles = dict(group_profiles or {})
        """Model groups routed by a profile of their own (``GroupConfig.profile``): group -> profile."""
        self.redact_session_ids = redact_session_ids
        """Keep the names clients give their sessions out of the decision log (hashes only)."""
        self.recorder: TrafficRecorder | None = None
        """Writes each answered request as a trace line (``[record]``), when set."""
        self.lease_idle_s = lease_idle_s
        self.learned = LearnedState()
        """What routing believes: this replica's learning merged with the others' (``gateway.replicas``)."""
        self.own_learned = LearnedState()
        """What this replica learned from its own outcomes (what it shares with the others)."""
        self.drained: frozenset[str] = frozenset()
        """Backends an admin drained: routing sends them no new requests (in-flight ones finish)."""
        self.asleep: Callable[[], Mapping[str, str]] = lambda: MappingProxyType({})
        """Residency members that do not hold the GPUs now, and why (``gateway.residency``)."""
        self.pins: dict[str, str] = {}
        """Model groups an admin pinned to one member: group -> member."""
        self._sequence = itertools.count()
        self._repeats = itertools.count(2)  # numbers the repeats of a new conversation's first prompt
        self._generations: dict[str, int] = {}  # the fleet's restart counts this router has acted on
        self.live = LiveSessions(lease_idle_s)
        """Sessions that sent a turn within ``lease_idle_s``: how many compete for llama.cpp slots."""
        self.homes = Homes(stale_s=lease_idle_s)
        """Where the active sessions are at home: a crowded llama-server's turns share its slots; what
        each will send next (``policies.coming``)."""
        self.follow_ups = FollowUps()
        """How often a conversation known only by content had a second turn (a first turn's look-ahead)."""
        self.history = RouterHistory()
        """What this router's own traffic tells of each backend (the published routers' profiles read it)."""

    async def route(self, features: RequestFeatures, body: Mapping[str, Any]) -> Routed:
        """Route a request: its session, the engine's count where the estimate is near a window, the
        decision; refused as too long on an estimate, counted and decided again (a refusal stands on
        the engine's count). A token count has no session, no slot and nothing to learn."""
        if features.endpoint is Endpoint.COUNT_TOKENS:
            return await self.decide(features, None)
        features, session = await self.resolve_session(features)
        features = await self.count_if_near_limit(features, body, session)
        routed = await self.decide(features, session)
        if too_long_everywhere(routed.decision) and not features.prompt_exact:
            features = await self.count_if_near_limit(features, body, session, always=True)
            routed = await self.decide(features, session)
        return routed

    async def _new_implicit(self, chain: PromptChain) -> str:
        """A new conversation's key: its first prompt's digest, numbered when another live session
        began with the same prompt (a repeat of it is a conversation of its own)."""
        key = f"i:{chain.whole:016x}"
        while await self.store.get_session(key) is not None:
            key = f"i:{chain.whole:016x}.{next(self._repeats)}"
        return key

    def absorb(self, outcome: Outcome, deployment: Deployment) -> None:
        """Learn from a finished request on ``deployment`` (what this replica shares with the others too)."""
        self.learned = learn(self.learned, outcome, deployment)
        self.history.answered(outcome)
        if self.store.shared_by_replicas:
            self.own_learned = learn(self.own_learned, outcome, deployment)

    def absorb_prefill(self, outcome: Outcome, deployment: Deployment) -> None:
        """Learn a background warm-up's prefill rate (``policies.learning.learn_prefill``)."""
        self.learned = learn_prefill(self.learned, outcome, deployment)
        if self.store.shared_by_replicas:
            self.own_learned = learn_prefill(self.own_learned, outcome, deployment)

    async def resolve_session(self, features: RequestFeatures) -> tuple[RequestFeatures, SessionView | None]:
        """The request's session: the named one, else the known one whose last prompt this one
        extends (the prefix index), else a new one. A prompt that extends the session's last one is
        estimated as that prompt's exact count plus its new part."""
        key = features.session_key
        if key is None:
            if not features.chain.length:
                return features, None
            key = await self.store.find_session(features.chain) or await self._new_implicit(features.chain)
            features = replace(features, session_key=key, session_source=SessionSource.IMPLICIT)
        session = await self.store.get_session(key) or SessionView(key=key)
        added = None if features.prompt_exact else added_part(features, session)
        if added is not None:
            chars_per_token = self.learned.for_model(features.model).chars_per_token.value
            estimate = round(len(added) / chars_per_token) + MESSAGE_OVERHEAD_TOKENS * added.count(
                MESSAGE_START
            )
            features = replace(
                features, prompt_tokens=session.prompt_tokens + estimate, prompt_counted="added"
            )
        return features, session

    async def count_if_near_limit(
        self,
        features: RequestFeatures,
        body: Mapping[str, Any],
        session: SessionView | None,
        *,
        always: bool = False,
    ) -> RequestFeatures:
        """Replace the estimate by the engine's count when it is close to a context window.

        Estimates come from characters; near a limit the difference decides between a backend and
        a 400, so the first healthy candidate whose window is within the margin is asked. The margin
        is wide until the model's characters per token were learned, narrow after. A turn that
        extends its session's last prompt (whose exact count the engine reported) has only its new
        part counted, so a warm turn never waits on re-tokenizing the whole conversation.
        ``always``: count wherever the estimate stands (before refusing a prompt as too long).
        """
        if features.prompt_exact or (features.prompt_tokens < MIN_COUNTED_PROMPT and not always):
            return features
        learned = self.learned.for_model(features.model).chars_per_token.samples > 0
        margin = NEAR_LIMIT_LEARNED if learned else NEAR_LIMIT
        deployments = (
            (snapshot, snapshot.deployment_for(name))
            for snapshot in self.fleet.snapshots()
            for name in features.members or (features.model,)  # a group: each member's deployments
        )
        for snapshot, deployment in deployments:
            window = deployment.context_window if deployment else None
            if deployment is None or window is None or snapshot.health not in (Health.READY, Health.UNKNOWN):
                continue
            if abs(features.prompt_tokens - window) > margin * window and not always:
                continue
            adapter = self.fleet.adapter(snapshot.backend_id)
            added = added_part(features, session) if session is not None else None
            if added is not None and session is not None:
                text = added.translate(None, SEPARATORS).decode("utf-8", "replace")
                part = await adapter.count_tokens(Endpoint.COMPLETIONS, {"prompt": text}, deployment)
                if part is not None:
                    total = (
                        session.prompt_tokens + part + MESSAGE_OVERHEAD_TOKENS * added.count(MESSAGE_START)
                    )
                    return replace(features, prompt_tokens=total, prompt_exact=True)
                continue
            count = await adapter.count_tokens(features.endpoint, body, deployment)
            if count is not None:
                return replace(features, prompt_tokens=count, prompt_exact=True, prompt_counted="counted")
        return features

    async def _forget_restarted(self) -> None:
        """An engine that restarted holds nothing: forget its leases and what it held (once)."""
        for backend, generation in self.fleet.generations.items():
            if self._generations.get(backend, 0) != generation:
                self._generations[backend] = generation
                await self.store.forget_backend(backend)
                log.info(
                    "backend.forgotten", backend=backend, note="restarted: its slots and caches are empty"
                )

    async def _context(
        self, session: SessionView | None, excluded: frozenset[str], chain: PromptChain, history: bool
    ) -> tuple[Any, RoutingContext]:
        await self._forget_restarted()
        now = self.clock.time()
        snapshots = [s for s in self.fleet.snapshots() if s.backend_id not in excluded]
        leases = {
            s.backend_id: await self.store.leases(s.backend_id)
            for s in snapshots
            if s.kind is EngineKind.LLAMACPP
        }
        indexed = (
            await self.store.match_prefix(chain, [s.backend_id for s in snapshots]) if chain.length else {}
        )
        matches = remembered_slot(indexed, session, leases, chain)
        own = session.key if session is not None else None
        context = RoutingContext(
            session=session,
            leases=leases,
            learned=self.learned,
            sequence=next(self._sequence),
            matches=matches,
            lease_idle_s=self.lease_idle_s,
            drained=self.drained,
            asleep=self.asleep(),
            pins=MappingProxyType(dict(self.pins)),
            live_sessions=self.live.count(self.clock.time()),
            homes=self.homes.counts(now, excluding=own),
            coming=self.homes.coming(now, excluding=own),
            follow_rate=self.follow_ups.rate_for(chain.family),
            routers={s.backend_id: self.history.view(self.fleet, s.backend_id, now) for s in snapshots}
            if history
            else MappingProxyType({}),
        )
        return snapshots, context

    async def decide(
        self,
        features: RequestFeatures,
        session: SessionView | None,
        excluded: frozenset[str] = frozenset(),
        overflowed: tuple[str, ...] = (),
    ) -> Routed:
        """Route, and hold the chosen slot for the session (re-routing if another request took it first)."""
        routed = await self._decide(features, session, excluded, overflowed)
        routed = await self._warm(routed)
        if routed.decision.chosen is not None and features.endpoint is not Endpoint.COUNT_TOKENS:
            backend, now = routed.decision.chosen.backend_id, self.clock.time()
            self.history.sent(backend, now)
            chain, tokens = features.chain, features.prompt_tokens
            self.store.launched(backend, routed.decision.slot, chain, tokens)
            if routed.warm is not None:
                self.store.launched(routed.warm.backend_id, routed.warm.slot, chain, tokens)
            if session is not None and proven(features, session):
                chosen = routed.decision.chosen_candidate
                estimate = chosen.estimate if chosen is not None else None
                again = bool(excluded or overflowed)  # a re-route: the same turn
                total = estimate.total_s if estimate is not None else 0.0
                tokens = routed.features.prompt_tokens
                self.homes.placed(
                    session.key, backend, now, again=again, prompt_tokens=tokens, ends_at=now + total
                )
        move = moved(routed)
        if move is not None and session is not None:
            log.info("session.moved", session=session_label(session.key), **move)
        return routed

    async def _warm(self, routed: Routed) -> Routed:
        """The decision's background warm-up (``policies.warm``), with its slot held for a session
        proven to continue; none where another session took the slot first."""
        warm, session = routed.decision.warm_up, routed.session
        if warm is None or routed.features.endpoint is Endpoint.COUNT_TOKENS:
            return routed
        if session is not None and proven(routed.features, session):
            tokens = routed.features.prompt_tokens
            now = self.clock.time()
            if not await self.store.claim_slot(warm.backend_id, warm.slot, session.key, now, None, tokens):
                return routed
        return replace(routed, warm=warm)

    async def _decide(
        self,
        features: RequestFeatures,
        session: SessionView | None,
        excluded: frozenset[str],
        overflowed: tuple[str, ...],
    ) -> Routed:
        if session is not None and proven(features, session):
            self.live.touch(session.key, self.clock.time())  # it competes for slots from now on
        if session is not None and features.session_source is SessionSource.IMPLICIT and not excluded:
            if session.turns == 0:  # counted once per request (a re-route excludes a backend)
                self.follow_ups.first_turn(features.chain.family)
            elif session.turns == 1:
                self.follow_ups.second_turn(features.chain.family)
        profile = self.group_profiles.get(features.model, self.profile) if features.members else self.profile
        for _ in range(CLAIM_ATTEMPTS):
            snapshots, context = await self._context(session, excluded, features.chain, profile.history)
            decision = route(features, snapshots, profile, self.clock.time(), context)
            chosen, slot = decision.chosen_candidate, decision.slot  # slot: None when not pinned
            if (
                chosen is None
                or chosen.estimate is None
                or slot is None
                or session is None
                or not proven(features, session)  # a first turn known by content only: pinned, not held
            ):
                return Routed(decision, features, session, overflowed)
            claimed = await self.store.claim_slot(
                chosen.deployment.backend_id,
                slot,
                session.key,
                self.clock.time(),
                chosen.estimate.evicts,
                features.prompt_tokens,
            )
            if claimed:
                if chosen.estimate.evicts is not None:
                    log.info("slot.evicted", backend=chosen.deployment.backend_id, slot=slot)
                return Routed(decision, features, session, overflowed)
        return Routed(decision, features, session, overflowed)
