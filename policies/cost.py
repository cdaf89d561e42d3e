"""The cost model: for one candidate, the cached tokens to expect and the time to first token and
to the last one, from the snapshot, the prefix index's match, the slot leases and what was learned.

    prefill  = prefill_s(prompt - cached, cached)     (``policies.pricing``: the engine profile,
               scaled by the learned rate; without a profile (prompt - cached) / prefill_tok_s)
    ttft     = queue_s * queue_factor + saves + checkpoint + prefill + interleaved     (both engines
               sample the first token from the prompt's last chunk, in the same step: no decode step)
    checkpoint = llama.cpp, hybrid: ``cache.checkpoint_restore_s`` when the slot resumes from a context
               checkpoint (the prompt diverges inside what it holds) rather than extending its live
               state (on the H100's 27B, a warm turn of ~400 tokens took 0.49 s where its tokens cost 0.36)
    saves    = llama.cpp: the idle slots' states the engine copies into its RAM cache when it
               launches the request, ``cache.ram_save_s`` each (``pricing.ram_saves_s``; on the H100
               a session's first turn on its slot after another session's turns waited 0.6 s for it)
    interleaved = vLLM: ceil((backlog tokens + prompt - cached) / step tokens) * the decode step of the
               requests running there (each step that takes a chunk of those prompts decodes them
               once; ``pricing.interleaved_decode_s``); other engines: 0
    total    = ttft + (expected_output - 1) * decode_step + stall
    stall    = the prompts it is expected to wait for while it decodes (``policies.coming``): the other
               sessions' next turns (each by the chance it arrives while this one decodes, times its
               prefill), pooled over the candidates of the engine kind (``policies.route.pooled_turns``);
               on a llama-server at most its other slots' worth, and on one of a single slot nothing (a
               prompt there waits for the slot). The other work's prompts are not counted: priced as
               their recent prefill seconds a second over the decode, they did not hold on the
               validation set once the replay stopped telling the answer's length (val-burst p90
               +1.3%; docs/benchmarks.md, twenty-fourth session).
               Issue #61: with two agents on the llama-server's slots, each one's answer was predicted
               0.335 s short on average, the other's next prompt stalling it
    decode_step = decode_step_s(requests already running on the engine, the prompt's tokens): the
               profile's step for that batch at that context over its step for one at none, divided
               by the learned decode_tok_s (which learning scales to no context the same way: priced
               at none, a long conversation's answer was predicted up to 4x early on the GPU); without
               a profile (1 + 0.06 * running) / decode_tok_s
               (an engine step prefills a chunk of prompts and decodes every running request once:
               a busy batch slows the answers, not the prompt)
    objective = ttft + horizon * future_s + evict_cost_s + margin + others   (total instead of ttft:
               cost-completion); margin = decode_step: the predicted TTFT once counted a decode step
               for the first token, which neither engine takes; out of the TTFT (a short prompt's
               prediction was 3x its first token), it is kept in the objective as a margin that grows
               with the batch running there: without it, the routing benchmark's chat rows lost 0.8%
               and mixed 2.2% of mean TTFT (docs/benchmarks.md, 2026-12-04)
    others   = what the request costs the ones that come next (``policies.others``: on vLLM its
               prefill, to each request arriving while it waits and prefills; a one-off's whole run on
               a llama.cpp slot; a session's turn on its own llama.cpp backend nothing)
    queue_s  = an idle llama.cpp slot, or vLLM: the prefill backlog of turnout's requests in flight
               there (both engines process earlier prompt chunks first; ``backends.inflight``: at
               least what streamed prompts without a first token still need, as the engine's clock
               says); vLLM at least queued * service_s / running from its own waiting queue
               (on llama.cpp without the prompts of requests deferred for a busy slot: they
               start after this one)
               a busy llama.cpp slot: what its request is predicted to still need (``busy_s``), plus
               the prompts deferred meanwhile (the other slots' prompts in the engine run in the
               steps that decode it: ``policies.slot_costs.slot_queue``)
               llama.cpp unpinned with no idle slot: the first slot to free + queued * service_s / slots
    queue_factor: vLLM: learned, how much longer queues really were than predicted
               (``policies.learning``); llama.cpp: 1 (its slot queue is modelled whole)

**Expected cached tokens** come from the prefix index (``PrefixMatch``: what turnout sent where)
and each engine's semantics. Of a prefix of ``n`` tokens an engine reuses at most ``reusable(n)``
(whole blocks of ``n - 1``), times a learned ratio:

- llama.cpp: per slot, what it holds or what the RAM prompt cache gives back (``policies.slots``).
- vLLM: the longest prefix sent there lately, in whole learned blocks, times ``reuse`` (a cache that
  never hit predicts nothing), if its prefix cache still holds it: the cache drops its least recently
  used blocks, so a prefix is expected gone once more tokens were sent there since it was
  (``prefix_cache_span``) than the KV cache holds (``BackendSnapshot.cache_tokens``, from
  ``vllm:cache_config_info``). On 8 vLLM replicas of the Mooncake trace, a prefix sent minutes before
  was predicted there: long prompts went to "hits" that re-prefilled 50k tokens, 18 s late
  (mooncake-8vllm's p90 was 1.02x the best peer's; docs/benchmarks.md, 2026-12-05).

**Slots** (llama.cpp): every slot is an option, with its own queue and, when it is taken from
another session, an eviction cost; the best objective wins (``policies.slots``).

**Sessions look ahead**: a session expected to go on weighs its next turn's TTFT ``future_s``
``LOOKAHEAD_TURNS * keep`` times: a pinned llama.cpp slot will hold the whole conversation, a vLLM
serving a hybrid model will re-prefill it. ``keep`` (``policies.slots.keep_chance``) is the chance a
pin lasts: 1 for a session holding a slot or while the live sessions fit in the slots, else
``slots / live sessions``: with 8 agents on 2 slots a newcomer's pin is likely taken back before it
pays off, so it should not outbid the holders. A first turn known only by its content (no session
id) is not proven to continue: it looks ahead only while a llama.cpp slot is free and unleased, and
then times ``follow``, the share of such first turns that came back lately (``RoutingContext.follow_rate``):
an agent's first turn can start where its conversation will be cheap, one-off traffic keeps it near 0.

    growth   = prompt - session's last prompt   (first turn: GROWTH_PRIOR of the prompt)
    future_s = lasting + prefill_s(prompt + growth - cached_next, cached_next)
               lasting: this turn's queue again (contention outlasts one turn), less on llama.cpp
               what happens once: a wait for the session's own slot, a RAM restore, the warm-ups'
               prefill (``_Objective.lasting``)
"""

from __future__ import annotations

from collections.abc import Sequence

from policies.coming import NextTurn, stall_s
from policies.decision import Estimate
from policies.learning import DeploymentStats, LearnedState, client_key
from policies.others import others_s, seat_of
from policies.pricing import checkpoint_restore_s, decode_step_s, interleaved_decode_s, prefill_s, ram_saves_s
from policies.slot_costs import Situation
from policies.slot_rules import consults_ram, ram_span, reuse
from policies.slots import DEFAULT_LEASE_IDLE_S, SlotOption, llama_options, proven, slots_of
from policies.types import (
    Architecture,
    BackendSnapshot,
    Deployment,
    Endpoint,
    EngineKind,
    PrefixMatch,
    RequestFeatures,
    SessionView,
    SlotLease,
)

LOOKAHEAD_TURNS = 3.0
GROWTH_PRIOR = 0.2


def queue_factor(snapshot: BackendSnapshot, stats: DeploymentStats) -> float:
    """What a predicted queue is scaled by (module docstring): the learned factor on vLLM, 1 on
    llama.cpp (a factor a state store still holds from before is not applied)."""
    return 1.0 if snapshot.kind is EngineKind.LLAMACPP else stats.queue_factor.value


def prefix_cache_span(match: PrefixMatch) -> int:
    """Tokens sent to a vLLM backend since the matched prefix was, and the prefix: what its prefix
    cache must hold for the prefix to be there still (it drops its least recently used blocks; a
    prefix inside a longer prompt, a shared system prompt, was sent with the newest of them)."""
    return match.recent_age + match.recent if match.recent else 0


def expected_output(
    features: RequestFeatures, learned: LearnedState, session: SessionView | None = None
) -> int:
    """The answer's expected tokens: the session's own answers so far, else the model's to its client
    (the program, ``RequestFeatures.client``), else the model's; never more than ``max_tokens``."""
    client = learned.clients.get(client_key(features.model, features.client)) if features.client else None
    if session is not None and session.answer_tokens > 0:
        typical = round(session.answer_tokens)
    elif client is not None and client.samples > 0:
        typical = round(client.value)
    else:
        typical = round(learned.for_model(features.model).completion_tokens.value)
    return max(1, min(features.max_tokens, typical) if features.max_tokens is not None else typical)


class _Objective:
    """One candidate's objective for each of its options: this turn's TTFT, the turns to come
    (``horizon`` of them, behind the same queue) and what an eviction costs. The next turn's prefill
    depends only on what it would find cached (``cached_next``: the same for every slot of a
    backend), so it is worked out once per value, and not at all without a horizon."""

    __slots__ = ("_next", "_prefill", "_queue_factor", "features", "horizon", "situation")

    def __init__(
        self, features: RequestFeatures, situation: Situation, horizon: float, factor: float
    ) -> None:
        self.features, self.situation, self.horizon = features, situation, horizon
        self._queue_factor = factor
        self._next: dict[int, float] = {}
        self._prefill: dict[int, float] = {}

    def prefill(self, cached: int) -> float:
        """This turn's prefill were ``cached`` tokens of it reused (once per value: options share them)."""
        seconds = self._prefill.get(cached)
        if seconds is None:
            new = self.features.prompt_tokens - cached
            features = self.features
            seconds = self._prefill[cached] = prefill_s(
                self.situation.deployment, self.situation.stats, new, cached, features.user_start,
                first_user=features.first_user_start,
            )  # fmt: skip
        return seconds

    def __call__(self, option: SlotOption) -> float:
        queue = option.queue_s * self._queue_factor
        ttft = queue + self.prefill(option.cached)
        if not self.horizon:
            return ttft + option.evict_cost_s
        return (
            ttft + self.horizon * self.future(option.cached_next, self.lasting(option)) + option.evict_cost_s
        )

    def lasting(self, option: SlotOption) -> float:
        """The part of this turn's queue the next turn is expected to meet again (contention lasts
        longer than one turn): all of it, except on llama.cpp a wait for the session's own slot (its
        own request there: a warm-up, ``policies.warm``, or its last turn), a RAM restore (this
        turn's only: the next finds the state in the slot) and the warm-ups' prefill in the engine
        (each runs once). Issue #45: counting those again kept a session off the slot it had just
        warmed, for a cold one."""
        snapshot = self.situation.snapshot
        if snapshot.kind is not EngineKind.LLAMACPP:
            return option.queue_s * self._queue_factor
        if option.mine:
            return 0.0
        if option.slot_wait_s > 0:
            return option.queue_s * self._queue_factor
        return max(option.queue_s - option.restore_s - snapshot.warming_s, 0.0) * self._queue_factor

    def future(self, cached_next: int, queue_s: float) -> float:
        """Predicted TTFT of the session's next turn (module docstring): its prefill, behind
        ``queue_s`` (``lasting``)."""
        prefill = self._next.get(cached_next)
        if prefill is None:
            prefill = self._next[cached_next] = _next_prefill(self.features, self.situation, cached_next)
        return queue_s + prefill


def _next_prefill(features: RequestFeatures, situation: Situation, cached_next: int) -> float:
    """The prefill of the session's next turn, were ``cached_next`` tokens of it cached."""
    session, stats = situation.session, situation.stats
    if session is None:
        return 0.0
    prompt = features.prompt_tokens
    growth = prompt - session.prompt_tokens if session.turns > 0 else round(prompt * GROWTH_PRIOR)
    next_prompt = prompt + max(growth, 1)
    token_exact = situation.snapshot.kind is EngineKind.LLAMACPP
    reported = situation.snapshot.cache_block
    reused = min(
        reuse(cached_next, stats, stats.reuse.value, token_exact=token_exact, reported=reported),
        next_prompt - 1,
    )
    return prefill_s(situation.deployment, stats, next_prompt - reused, reused)


def estimate(
    features: RequestFeatures,
    deployment: Deployment,
    snapshot: BackendSnapshot,
    *,
    session: SessionView | None,
    leases: Sequence[SlotLease],
    learned: LearnedState,
    match: PrefixMatch | None = None,
    now: float = 0.0,
    lease_idle_s: float = DEFAULT_LEASE_IDLE_S,
    keep: float = 1.0,
    follow: float = 0.0,
    sharing: int = 0,
    coming: Sequence[NextTurn] = (),
    share: float = 1.0,
) -> Estimate:
    """Predict this candidate's reuse and timing (see the module docstring for the formulas);
    ``keep``: the chance a slot pinned now lasts (``policies.slots.keep_chance``); ``follow``: the
    chance a session not yet proven to continue has a next turn (0: no look-ahead); ``sharing``: the
    active sessions at home on a crowded llama-server (``policies.homes``: its turns share its slots;
    0: not crowded); ``coming``: the other sessions' next turns expected there, each counting
    ``share`` (pooled over the engine kind's candidates: ``policies.route.pooled_turns``)."""
    stats = learned.for_deployment(deployment, snapshot.kind)
    situation = Situation(
        snapshot, deployment, stats, match or PrefixMatch(), session, leases, now, lease_idle_s, sharing
    )
    chance = 1.0 if proven(features, session) else follow if session is not None else 0.0
    horizon = LOOKAHEAD_TURNS * keep * chance
    factor = queue_factor(snapshot, stats)
    objective = _Objective(features, situation, horizon, factor)
    if features.endpoint is Endpoint.COUNT_TOKENS:  # the engine only counts: no slot, no queue
        option = SlotOption(None, 0, "none", 0.0, 0)
    elif snapshot.kind is EngineKind.LLAMACPP:
        options = llama_options(features, situation)
        last_used = {lease.slot: lease.last_used for lease in leases}
        option = min(
            options,
            key=lambda o: (
                round(objective(o), 6),
                o.slot is None,
                not o.mine,  # a tie never moves a session off its own slot...
                o.evicts is not None,  # ...nor takes another's when a free one does as well
                last_used.get(o.slot, -1.0) if o.slot is not None else 0.0,
            ),
        )
    else:
        bound = snapshot.cache_tokens
        held = bound is None or prefix_cache_span(situation.match) <= bound  # not dropped since
        shared = situation.match.recent if held else 0
        cached = reuse(shared, stats, stats.reuse.value, token_exact=False, reported=snapshot.cache_block)
        waiting = snapshot.queued * stats.service_s.value / max(snapshot.running, 1)
        queue = max(waiting, snapshot.prefill_backlog_s)
        option = SlotOption(
            None, cached, "prefix-cache" if cached else "none", queue, features.prompt_tokens, usable=shared
        )
    prompt = features.prompt_tokens
    cached = max(0, min(option.cached, prompt - 1))
    decode_step = decode_step_s(deployment, stats, snapshot.running, prompt)  # as learning scales it
    prefill = objective.prefill(cached)
    queue = option.queue_s * factor
    interleaved = 0.0
    if snapshot.kind is EngineKind.VLLM:  # the steps of the backlog ahead and of this prompt
        ahead = snapshot.prefill_backlog_s * stats.prefill_tok_s.value
        interleaved = interleaved_decode_s(deployment, stats, snapshot.running, ahead + prompt - cached)
    saves = 0.0
    if snapshot.kind is EngineKind.LLAMACPP:  # the engine copies idle slots to RAM before it starts
        target = option.slot if option.slot is not None else option.lands
        there = next((m for m in situation.match.slots if m.slot == target), None)
        keeps = there is not None and not consults_ram(there, features.prompt_tokens)  # no save of it first
        hybrid = deployment.architecture is Architecture.HYBRID
        holds = {m.slot: m.checkpoints for m in situation.match.slots} if hybrid else {}
        saves = ram_saves_s(deployment, snapshot.slots, target, keeps, holds)
    checkpoint = checkpoint_restore_s(deployment) * (
        1.0 if option.restores else 1.0 - stats.live.value if option.continues else 0.0
    )
    ttft = queue + saves + checkpoint + prefill + interleaved
    decode = (expected_output(features, learned, session) - 1) * decode_step
    room = slots_of(snapshot) - 1 if snapshot.kind is EngineKind.LLAMACPP else None
    start = now + ttft
    stall = stall_s(coming, deployment, stats, start, start + decode, room, share) if coming else 0.0
    decode += stall
    total = ttft + decode
    # what the engine could reuse by its rules: learning measures how much of it it really did
    shared = option.usable
    return Estimate(
        expected_cached_tokens=cached,
        queue_s=queue,
        modelled_queue_s=option.queue_s,
        deferred_s=option.deferred_s * factor,
        ttft_s=ttft,
        total_s=total,
        decode_s=decode,
        stall_s=stall,
        prefill_s=prefill,
        interleaved_s=interleaved,
        saves_s=saves,
        checkpoint_s=checkpoint,
        restores=option.restores,
        continues=option.continues,
        shared_prefix_tokens=shared,
        future_s=objective.future(option.cached_next, objective.lasting(option)) if horizon else 0.0,
        horizon=horizon,
        contended=snapshot.running > 0 or snapshot.queued > 0,
        slot=option.slot,
        warm=option.warm,
        evicts=option.evicts,
        evict_cost_s=option.evict_cost_s,
        source=option.source,
        ram_tokens=option.ram_potential,
        ram_span=ram_span(situation.match) if option.ram_potential else 0,
        note=option.note(),
        primed=stats.primed,
        margin_s=decode_step,
        others_s=0.0  # a token count holds nothing
        if features.endpoint is Endpoint.COUNT_TOKENS
        else others_s(snapshot, prefill, queue, total - queue, seat_of(features, session, option, snapshot)),
    )
