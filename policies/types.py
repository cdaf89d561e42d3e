"""The frozen shapes that flow through routing: what policies may know (what they decide, and what
came of it, is ``policies.decision``).

Everything here is plain data: built by the gateway and the backend probes, read by the pure
functions in this package. Nothing here does I/O or reads a clock.
"""

from __future__ import annotations

from enum import StrEnum

import msgspec

from policies.engine_profile import EngineProfile
from policies.prefix import EMPTY_CHAIN, PromptChain, PromptMark
from policies.shape import PromptShape


class EngineKind(StrEnum):
    """Which engine speaks behind a backend; adapters and the cost model key on it."""

    VLLM = "vllm"
    LLAMACPP = "llamacpp"
    OPENAI = "openai"


class Architecture(StrEnum):
    """The model's layer family; decides how an engine can reuse a cached prefix."""

    DENSE = "dense"
    HYBRID = "hybrid"  # Gated DeltaNet / Mamba layers beside attention: recurrent state
    MOE = "moe"


class Health(StrEnum):
    """A backend's state as its last probe saw it."""

    UNKNOWN = "unknown"  # not probed yet
    LOADING = "loading"  # up, model still loading (llama: 503 "Loading model"; vLLM: refused)
    READY = "ready"
    DOWN = "down"  # refused, timed out or failed


class Endpoint(StrEnum):
    """The client-facing API a request came in on."""

    CHAT = "chat.completions"
    COMPLETIONS = "completions"
    MESSAGES = "messages"  # Anthropic
    COUNT_TOKENS = "messages.count_tokens"  # Anthropic
    RESPONSES = "responses"  # OpenAI Responses

    @property
    def anthropic(self) -> bool:
        return self in (Endpoint.MESSAGES, Endpoint.COUNT_TOKENS)


class Reason(StrEnum):
    """Why a candidate was dropped, or why the chosen one won. Shown in headers, logs and the dashboard."""

    NOT_SERVED = "model-not-served"
    UNHEALTHY = "backend-unhealthy"
    CONTEXT_TOO_LONG = "context-too-long"
    DRAINED = "drained"
    ASLEEP = "asleep"  # its residency set holds another member awake on the GPUs (policies.stages)
    CIRCUIT_OPEN = "circuit-open"
    OUTPUT_WOULD_BE_CUT = "output-would-be-cut"
    UNSUPPORTED = "unsupported-by-engine"
    ONLY_CANDIDATE = "only-candidate"
    LEAST_LOADED = "least-loaded"
    LOWEST_TTFT = "lowest-predicted-ttft"
    LOWEST_COMPLETION = "lowest-predicted-completion"
    ROUND_ROBIN = "round-robin"
    PREFERRED_ENGINE = "preferred-engine"
    NO_CANDIDATE = "no-eligible-backend"
    KEEPS_MODEL = "conversation-keeps-its-model"
    STAYS_HOME = "session-stays-home"  # a crowded llama-server keeps its sessions (policies.homes)
    BELOW_SIZE_FLOOR = "below-size-floor"
    PINNED = "group-pinned"
    DEFAULT_MEMBER = "default-member"
    PEER_RULE = "peer-rule"  # chosen by a published router's rule (policies.peers)


class Awaited(StrEnum):
    """What the client waits for before it can act (``policies.cost``: the objective it is routed by)."""

    FIRST_TOKEN = "first-token"  # a person reading the answer as it streams
    LAST_TOKEN = "last-token"  # an agent: it acts on a tool call only once the whole call has arrived


class SessionSource(StrEnum):
    """How a request's session was recognised (documented priority order, first match wins)."""

    HEADER = "header"  # x-session-id
    AGENT_HEADER = "agent-header"  # an agent's own session header, e.g. x-claude-code-session-id
    PROMPT_CACHE_KEY = "prompt_cache_key"
    USER = "user"
    METADATA = "metadata.user_id"  # Anthropic
    IMPLICIT = "implicit"  # the conversation continues a known one (message-prefix hashes)
    NONE = "none"


class Deployment(msgspec.Struct, frozen=True):
    """One model on one backend: the facts routing needs about that pair."""

    model: str
    backend_id: str
    upstream_name: str
    context_window: int | None = None
    architecture: Architecture = Architecture.DENSE
    quantization: str | None = None
    params_total_b: float | None = None
    params_active_b: float | None = None
    profile: EngineProfile | None = None
    """How fast this engine is (``policies.engine_profile``): the router's priors and the shape of
    its predictions; None: the kind's two default rates, linear."""


class SlotState(msgspec.Struct, frozen=True):
    """One llama-server slot as ``/slots`` reported it.

    ``busy_s``: when turnout itself has a request running there, the predicted seconds it still
    needs (the fleet fills it in from its requests in flight); None when unknown.
    """

    id: int
    n_ctx: int
    is_processing: bool
    busy_s: float | None = None
    task: int | None = None  # the id of its last task (``id_task``); None: none yet, or not said
    tokens: int | None = None  # the prompt tokens its cache holds (``n_prompt_tokens``)
    unsaved: int = 0  # tokens of turnout's request that ended there after the last launch: the next saves it


class BackendSnapshot(msgspec.Struct, frozen=True):
    """An immutable view of one backend at one instant, produced by its probe.

    ``deployments`` are the configured deployments on this backend, with context windows corrected
    from what the engine itself reports (``max_model_len``, llama's per-slot ``n_ctx``).
    """

    backend_id: str
    kind: EngineKind
    health: Health
    taken_at: float
    deployments: tuple[Deployment, ...] = ()
    served_names: tuple[str, ...] = ()
    running: int = 0
    queued: int = 0
    kv_usage: float | None = None
    slots: tuple[SlotState, ...] = ()
    total_slots: int | None = None
    prefix_cache_queries: float | None = None
    prefix_cache_hits: float | None = None
    error: str | None = None
    prefill_backlog_s: float = 0.0  # predicted prompt processing turnout's requests there still need
    deferred_prefill_s: float = 0.0  # the same of its requests deferred for a busy llama.cpp slot
    warming_s: float = 0.0  # of prefill_backlog_s, background warm-ups' (``policies.warm``)
    work_done: float | None = None  # a counter the engine only raises while it runs (tokens processed):
    # lower than before means it restarted, and holds nothing turnout sent it
    cache_block: int | None = None  # vLLM: the tokens its prefix cache hits come in, as it reports them
    # (None: prefix caching off, or not reported; turnout then learns it from the hits)
    cache_tokens: int | None = None  # vLLM: the tokens its KV cache holds, the bound of its prefix cache
    # (it drops its least recently used blocks; None: not reported, no bound assumed)
    circuit: str = "closed"  # closed, or open / half-open while its circuit breaker keeps requests away
    circuit_blocks: bool = False  # no request may go there now (open, or half-open with its trial out)
    arrivals_per_s: float = 0.0  # turnout's requests begun here per second lately (``backends.inflight``)
    warnings: tuple[str, ...] = ()  # what the probe saw the engine do against turnout's plan, with
    # the fix (llama-server clearing idle slots: ``backends.llamacpp``)

    @property
    def busy_slots(self) -> int:
        return sum(1 for slot in self.slots if slot.is_processing)

    def deployment_for(self, model: str) -> Deployment | None:
        return next((d for d in self.deployments if d.model == model), None)


class RequestFeatures(msgspec.Struct, frozen=True):
    """What a policy may know about one request, extracted once from its body.

    ``chain`` is the prompt as content-addressed chunks (``policies.prefix``): a request that
    resends a known conversation plus new turns shares the chunks of what it resends.
    """

    model: str
    endpoint: Endpoint
    prompt_tokens: int  # an estimate unless counted exactly
    max_tokens: int | None
    stream: bool
    session_key: str | None = None
    session_source: SessionSource = SessionSource.NONE
    chain: PromptChain = EMPTY_CHAIN
    shape: PromptShape | None = None  # per-message digests (chat, messages, responses)
    prompt_chars: int = 0
    prompt_exact: bool = False  # prompt_tokens was counted by an engine's tokenizer
    prompt_counted: str = "estimate"  # "estimate", "counted" (whole prompt) or "added" (previous + new part)
    needs_response_store: bool = False  # a Responses request with previous_response_id
    members: tuple[str, ...] = ()
    """For a model group: its member models, the default first (``model`` is then the group's name);
    empty for a plain model."""
    min_params_b: float | None = None
    """The smallest model the client accepts, in billions of parameters (``x-turnout-min-params-b``)."""
    prefer_default: float = 0.0
    """For a model group: how much better another member must score than the default member (the
    first of ``members``) to answer instead: 0.25 means 25% (with the ``cost`` profile, predicted 1.25x
    faster); 0: the cost model alone chooses."""
    awaited: Awaited = Awaited.FIRST_TOKEN
    awaited_why: str = ""  # why the client waits for the last token (``policies.features.awaited``)
    client: str = ""  # the client program, from its User-Agent (``claude-cli``, ``codex``...; "" unknown)

    user_share: float = -1.0
    """Where the prompt's last user message starts, as a share of the prompt (``policies.features.
    user_starts``; -1: none, or a text completion)."""
    first_user_share: float = -1.0
    """Where its first user message starts, as a share of the prompt (-1: none, or a text completion)."""
    first_user_bytes: int = -1
    """Where its first user message starts in the rendered prompt, in bytes (-1: none): ``head``."""

    @property
    def head(self) -> PromptMark | None:
        """The prompt up to its first user message (its system prompt and tools): another session
        with the same head restores the checkpoint a cold prompt takes there
        (``gateway.state.prefix_index``). Digested when first asked (the chain keeps it): after the
        answer, when the prompt is recorded, not while the request is routed."""
        return self.chain.mark_at(self.first_user_bytes) if self.first_user_bytes > 0 else None

    @property
    def user_start(self) -> int:
        """Where the prompt's last user message starts, in (estimated) tokens: llama-server ends a
        prefill step there (``EngineProfile.step_tokens``); -1 for none."""
        return self.user_start_at(self.prompt_tokens)

    def user_start_at(self, tokens: int) -> int:
        """``user_start`` of the prompt counted as ``tokens`` tokens (the engine's own count)."""
        return -1 if self.user_share <= 0 else round(tokens * self.user_share)

    @property
    def first_user_start(self) -> int:
        """Where the prompt's first user message starts, in (estimated) tokens: llama-server
        checkpoints it on a slot with none (``policies.checkpoints``); -1 for none."""
        return self.first_user_start_at(self.prompt_tokens)

    def first_user_start_at(self, tokens: int) -> int:
        """``first_user_start`` of the prompt counted as ``tokens`` tokens (the engine's own count)."""
        return -1 if self.first_user_share <= 0 else round(tokens * self.first_user_share)


class SessionView(msgspec.Struct, frozen=True):
    """What the gateway remembers of a session: where it went last, and its last prompt.

    ``prompt_tokens`` is the engine's count of the session's last prompt, ``prompt`` that prompt's
    mark (its length and digests, no text): a turn that extends it only needs its new part counted.
    Where each backend holds the conversation is the prefix index's business, not the session's.
    """

    key: str
    backend_id: str | None = None
    slot: int | None = None
    prompt_tokens: int = 0
    cached_tokens: int = 0
    turns: int = 0
    last_seen: float = 0.0
    prompt: PromptMark | None = None
    shape: PromptShape | None = None  # the last prompt's per-message digests (dashboard diagnostics)
    source: str = ""  # how it was recognised (SessionSource value)
    first_seen: float = 0.0
    total_prompt_tokens: int = 0
    total_cached_tokens: int = 0
    saved_s: float = 0.0  # prefill seconds its cached tokens saved, at the learned rates
    model: str | None = None  # the model that answered its last turn (a group's member: it keeps it)
    agent: bool = False  # a turn of it offered tools: its client acts on whole answers
    answer_tokens: float = 0.0  # its answers' tokens, a moving average (0: none answered yet)


class SlotLease(msgspec.Struct, frozen=True):
    """A llama.cpp slot held by one session since its last request there (``tokens``: its last prompt)."""

    slot: int
    session_key: str
    last_used: float
    tokens: int = 0


class SlotMatch(msgspec.Struct, frozen=True):
    """What one llama.cpp slot holds of a prompt, by turnout's prefix index.

    ``tokens``: the prompt's longest prefix the slot holds; ``whole``: the slot's whole prompt is a
    prefix of this one (a hybrid slot continues its live state instead of restoring a checkpoint);
    ``checkpoint``: the newest checkpoint the slot holds at or below ``tokens``: what a hybrid slot
    restores when the prompt diverges inside what it holds (0: none known; a RAM cache entry has none).
    """

    slot: int
    tokens: int
    whole: bool = False
    held: int = 0  # tokens of the prompt the slot holds (0: turnout sent nothing there)
    checkpoint: int = 0
    checkpoints: int = 0  # how many context checkpoints the slot holds (a RAM-cache save copies each)


class PrefixMatch(msgspec.Struct, frozen=True):
    """What one backend holds of a prompt, by turnout's prefix index.

    ``slots``: per llama.cpp slot, what turnout last sent there; ``recent``: the longest prefix of
    any prompt turnout sent to the backend lately (what llama.cpp's RAM prompt cache, or vLLM's
    prefix cache, may still hold).
    """

    slots: tuple[SlotMatch, ...] = ()
    recent: int = 0
    recent_whole: bool = False  # the recent prompt it matches is a prefix of this one, whole
    recent_held: int = 0  # tokens of that recent prompt
    recent_age: int = 0  # tokens turnout sent to the backend after it (a RAM cache drops the oldest first)

    def slot(self, slot: int) -> SlotMatch:
        return next((m for m in self.slots if m.slot == slot), SlotMatch(slot, 0))

    @property
    def best_recent(self) -> SlotMatch:
        """The recent prompt it matches, as a slot would hold it (what a RAM cache restore gives)."""
        return SlotMatch(-1, self.recent, self.recent_whole, self.recent_held)


class Usage(msgspec.Struct, frozen=True):
    """Token counts (and engine timings, where the engine reports them) of one finished request.

    ``cached_tokens`` is the prompt prefix the engine reused; ``None`` when the engine did not say
    (vLLM without ``--enable-prompt-tokens-details``). ``prompt_ms``/``predicted_ms`` are
    llama.cpp's own prefill and decode times.
    """

    prompt_tokens: int
    completion_tokens: int
    cached_tokens: int | None = None
    prompt_ms: float | None = None
    predicted_ms: float | None = None
