"""What routing decides, and what came of it: the frozen shapes of a decision.

Each candidate that passed every filter gets the cost model's ``Estimate`` and a score
(``ScoredCandidate``), each one dropped a ``Rejection``; the ``Decision`` holds them all, with a
``WarmUp`` where the chosen candidate warms a llama.cpp slot for the session's next turn. ``Outcome``
is what the request then really did, which learning compares with its estimate. Plain data built from
what policies may know (``policies.types``); nothing here does I/O or reads a clock.
"""

from __future__ import annotations

import msgspec

from policies.types import Deployment, EngineKind, Reason, Usage


class Rejection(msgspec.Struct, frozen=True):
    """A candidate a filter dropped, and why (``window``: the context window it was measured against)."""

    backend_id: str
    reason: Reason
    detail: str
    window: int | None = None


class WarmUp(msgspec.Struct, frozen=True):
    """A llama.cpp slot to prefill this request's prompt into in the background, while the request
    itself is served elsewhere, so the session's next turn finds it warm (``policies.warm``)."""

    backend_id: str
    slot: int
    ready_s: float  # predicted: when the slot holds the prompt (its queue + prefill there)
    prefill_s: float  # predicted: the prompt's prefill there (the rest of ready_s is its queue)
    cost_s: float  # what the warm-up's prefill costs the requests arriving there meanwhile
    cached_tokens: int = 0  # of the prompt, what the slot already holds
    delay_s: float = 0.0  # sent this long after the request: the prompts clients wait for go first


class Estimate(msgspec.Struct, frozen=True):
    """The cost model's prediction for one candidate.

    ``slot`` is the llama.cpp slot the request would be pinned to (``None`` for other engines);
    ``evicts`` the session that slot would be taken from; ``warm`` whether the session's own
    cache is there.
    """

    expected_cached_tokens: int
    queue_s: float
    ttft_s: float
    total_s: float
    prefill_s: float = 0.0  # this request's own prompt processing, after its queue
    interleaved_s: float = 0.0  # vLLM: the decode steps run in the same steps as its prompt chunks
    saves_s: float = 0.0  # llama.cpp: idle slots copied to the RAM cache before it starts (``ram_save_s``)
    checkpoint_s: float = 0.0  # llama.cpp, hybrid: a context checkpoint restored (``checkpoint_restore_s``)
    restores: bool = False  # the slot resumes from a checkpoint: the prompt diverges inside what it holds
    continues: bool = False  # the prompt continues the slot's last one: a restore unless it is live
    modelled_queue_s: float = 0.0  # queue_s before the learned queue_factor
    deferred_s: float = 0.0  # llama.cpp: queue_s spent deferred for a slot busy with others' work
    shared_prefix_tokens: int = 0  # what the engine could reuse by its rules (learning divides by it)
    future_s: float = 0.0  # predicted TTFT of the session's next turn if this candidate serves this one
    contended: bool = False  # the engine was busy: its TTFT will say little about its prefill rate
    horizon: float = 0.0  # how many more turns the session is expected to send
    slot: int | None = None
    warm: bool = False
    evicts: str | None = None
    evict_cost_s: float = 0.0  # what taking the slot costs its session's next turn
    source: str = "none"  # where the expected cached tokens come from: slot, ram, prefix-cache, none
    ram_tokens: int = 0  # what llama.cpp's RAM cache would give, were the entry still there
    ram_span: int = 0  # tokens sent to the backend since that entry began (it must fit in the cache)
    note: str = ""
    primed: bool = False  # made on the deployment's measurements, not priors (teaches queue_factor)
    margin_s: float = 0.0  # a decode step of the batch running there: in the objective, not the TTFT
    others_s: float = 0.0  # what sending it here is expected to add to the requests that come next
    warm_up: WarmUp | None = None  # a llama.cpp slot warmed meanwhile for the next turn (in future_s)
    decode_s: float = 0.0  # the expected answer's decode after its first token (total_s - ttft_s)
    stall_s: float = 0.0  # of decode_s: the other sessions' next prompts it waits for (``policies.coming``)

    @property
    def objective_ttft_s(self) -> float:
        """This turn's TTFT, the expected TTFT of the turns still to come, what an eviction costs, the
        margin and what it costs the requests that come next (``policies.cost``)."""
        return self.ttft_s + self.horizon * self.future_s + self.evict_cost_s + self.margin_s + self.others_s

    @property
    def objective_total_s(self) -> float:
        """The same to the last token: this turn's, and the turns to come each with an answer as long
        decoded where this one is (a session stays where it is warm)."""
        future = self.horizon * (self.future_s + self.decode_s)
        return self.total_s + future + self.evict_cost_s + self.margin_s + self.others_s


class ScoredCandidate(msgspec.Struct, frozen=True):
    """A candidate that passed every filter, with its weighted score (higher is better)."""

    deployment: Deployment
    score: float
    components: tuple[tuple[str, float], ...] = ()
    estimate: Estimate | None = None


class Decision(msgspec.Struct, frozen=True):
    """The outcome of routing: the chosen deployment (or none), every candidate and every rejection."""

    profile: str
    chosen: Deployment | None
    reason: Reason
    candidates: tuple[ScoredCandidate, ...] = ()
    rejected: tuple[Rejection, ...] = ()
    pinned: bool = True
    """The request goes to the chosen candidate's llama.cpp slot (False: the engine picks one)."""
    follow_rate: float | None = None
    """A first turn known only by its content: the chance it comes back that its look-ahead was
    weighed by (``RoutingContext.follow_rate``, its prompt family's); None for any other request."""
    objective: str = ""
    """What the candidates were compared by where a cost scorer did it: ``first-token`` or
    ``last-token`` (``policies.awaited``); "" for the other profiles."""
    objective_why: str = ""
    """Why the last token (tools in the request, an agent's header or session); "" for the first."""

    @property
    def chosen_candidate(self) -> ScoredCandidate | None:
        for candidate in self.candidates:  # routing chose one of these very objects: no field compares
            if candidate.deployment is self.chosen:
                return candidate
        return next((c for c in self.candidates if c.deployment == self.chosen), None)

    @property
    def slot(self) -> int | None:
        chosen = self.chosen_candidate if self.pinned else None
        return chosen.estimate.slot if chosen is not None and chosen.estimate is not None else None

    @property
    def warm_up(self) -> WarmUp | None:
        """The llama.cpp slot to warm in the background while the chosen candidate serves the request."""
        chosen = self.chosen_candidate
        return chosen.estimate.warm_up if chosen is not None and chosen.estimate is not None else None

    @property
    def header(self) -> str:
        """``x-turnout-route-reason``: the reason, then why the others were dropped."""
        parts = [self.reason.value]
        chosen = self.chosen_candidate
        if chosen is not None and chosen.estimate is not None and chosen.estimate.note:
            parts.append(chosen.estimate.note)
        warm = self.warm_up
        if warm is not None:
            parts.append(f"warms {warm.backend_id} slot {warm.slot} for the next turn")
        parts += [f"{r.backend_id}: {r.reason.value}" for r in self.rejected]
        return "; ".join(parts)

    @property
    def explanation(self) -> str:
        """One human line: why this backend, or why none."""
        if self.chosen is not None:
            return f"{self.reason}: {self.chosen.backend_id}"
        details = "; ".join(f"{r.backend_id}: {r.detail}" for r in self.rejected)
        return details or "no backend serves this model"


class Outcome(msgspec.Struct, frozen=True):
    """What one routed request really did, for learning: measured by the gateway, told by the engine."""

    backend_id: str
    model: str
    kind: EngineKind
    usage: Usage
    ttft_s: float | None
    duration_s: float
    prompt_chars: int
    shared_prefix_tokens: int  # tokens the backend could reuse by its rules (Estimate)
    stream: bool
    contended: bool = False  # other work was running or queued there when it was sent
    shared_prefill: bool = False  # a background warm-up's prompt processing overlapped its own
    predicted: Estimate | None = None  # what the cost model expected of it, for learning to compare
    client: str = ""  # the client program (``RequestFeatures.client``): answer lengths are learned per client
    user_start: int = -1  # where its last user message starts (``RequestFeatures.user_start``)
    first_user: int = -1  # where its first user message starts (``RequestFeatures.first_user_start``)
