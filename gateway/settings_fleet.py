"""The fleet's settings (``[[backends]]``, ``[[models]]``, ``[[groups]]`` in the config file): each
engine endpoint with its timeouts, circuit breaking, engine profile and how ``turnout replay``
simulates it (``BackendConfig``), each model clients can ask for and where it is deployed
(``ModelConfig``, ``DeploymentConfig``), and each model group (``GroupConfig``). ``gateway.settings``
validates them together inside ``Settings`` and re-exports them.
"""

from __future__ import annotations

from pydantic import BaseModel, ConfigDict, Field, HttpUrl, model_validator

from backends.engine_profiles import ProfileNotFound, load_profile
from policies import Architecture, EngineKind
from policies.engine_profile import EngineProfile, ProfileSchemaError


class StrictModel(BaseModel):
    """A settings section: unknown keys are refused, and the values are frozen once read."""

    model_config = ConfigDict(extra="forbid", frozen=True)


class Timeouts(StrictModel):
    """Upstream timeouts in seconds."""

    connect: float = Field(5.0, gt=0)
    """Opening a connection to the engine."""
    read: float = Field(600.0, gt=0)
    """Longest wait for a response's first byte while the engine reports work running or queued (a
    request waiting for a llama.cpp slot, a long prefill), and for any one read."""
    first_byte: float = Field(30.0, gt=0)
    """Silence before the first byte while the engine reports nothing running or queued: it hung;
    the request goes to another backend (nothing reached the client yet)."""
    stream_idle: float = Field(60.0, gt=0)
    """Silence between two bytes once a stream has begun: it stalled; the stream ends with an error
    event."""
    probe: float = Field(2.0, gt=0)
    """One probe request (health, metrics, slots)."""


class CircuitConfig(StrictModel):
    """Circuit breaking (``backends.breaker``): a backend failing this many requests in a row gets
    none for a cool-down, then one trial; a failed trial doubles the cool-down, a success closes it."""

    failures: int = Field(3, ge=1)
    cool_down_s: float = Field(5.0, gt=0)
    max_cool_down_s: float = Field(60.0, gt=0)


class SimulatorConfig(StrictModel):
    """How ``turnout replay`` simulates a backend (``turnout serve`` ignores it): the engine model's
    settings beyond what the deployments say (``backends.sim.SimConfig``; unset: its defaults)."""

    slots: int | None = Field(None, ge=1)
    """llama.cpp ``-np``."""
    prefill_tok_s: float | None = Field(None, gt=0)
    decode_tok_s: float | None = Field(None, gt=0)
    batch_slowdown: float | None = Field(None, ge=0)
    """Decode step time = (1 / decode_tok_s) * (1 + batch_slowdown * (running - 1))."""
    prefill_chunk: int | None = Field(None, ge=1)
    """Prompt tokens per engine step (vLLM max_num_batched_tokens, llama.cpp n_batch)."""
    prefix_caching: bool | None = None
    """vLLM's prefix cache (default: off for a hybrid model, as in older vLLM releases; on otherwise)."""
    max_num_seqs: int | None = Field(None, ge=1)
    cache_ram_mib: int | None = Field(None, ge=-1)
    """llama.cpp ``--cache-ram`` (0 off, -1 no limit)."""


class BackendConfig(StrictModel):
    """One engine endpoint."""

    id: str = Field(pattern=r"^[A-Za-z0-9_.-]+$")
    """A short unique name used in headers, logs and the decision log."""
    kind: EngineKind
    """``vllm``, ``llamacpp`` or ``openai`` (any other OpenAI-compatible server)."""
    url: HttpUrl
    """Base URL of the engine, without ``/v1``."""
    api_key: str | None = None
    """Key turnout sends upstream as ``Authorization: Bearer``; never logged."""
    timeouts: Timeouts = Timeouts()
    circuit: CircuitConfig = CircuitConfig()
    probe_interval_s: float = Field(2.0, gt=0)
    """How often the engine's health and load are probed."""
    sim: SimulatorConfig = SimulatorConfig()
    """How ``turnout replay`` simulates this backend."""
    engine_profile: str | None = None
    """How fast this engine is: a built-in profile's name (``turnout calibrate --list``) or the path
    of one ``turnout calibrate`` wrote. The router's priors and the replay's engine model read it
    (learning still corrects it online); unset: the kind's default rates (docs/calibrate.md)."""

    @property
    def base_url(self) -> str:
        return str(self.url).rstrip("/")

    @model_validator(mode="after")
    def _profile_loads(self) -> BackendConfig:
        self.load_engine_profile()
        return self

    def load_engine_profile(self) -> EngineProfile | None:
        """The engine profile this backend names, read and checked (None when it names none)."""
        if self.engine_profile is None:
            return None
        try:
            profile = load_profile(self.engine_profile)
        except (ProfileNotFound, ProfileSchemaError) as exc:
            raise ValueError(f"engine_profile: {exc}") from exc
        if profile.engine != self.kind.value:
            raise ValueError(
                f"engine_profile {self.engine_profile!r} is a {profile.engine} profile; backend {self.id!r}"
                f" is {self.kind.value}"
            )
        return profile


class DeploymentConfig(StrictModel):
    """Where a model is served: on which backend, under which upstream name, with which window."""

    backend: str
    """The ``id`` of a configured backend."""
    upstream_name: str
    """The model name that engine answers to (vLLM ``--served-model-name``, llama ``--alias``)."""
    context_window: int | None = Field(None, gt=0)
    """Tokens per request; the smaller of this and what the engine reports is used."""
    quantization: str | None = None


class ModelConfig(StrictModel):
    """A model clients can ask for, and its deployments."""

    name: str
    aliases: tuple[str, ...] = ()
    architecture: Architecture = Architecture.DENSE
    params_total_b: float | None = Field(None, gt=0)
    """Total parameters, in billions."""
    params_active_b: float | None = Field(None, gt=0)
    """Parameters active per token (MoE), in billions."""
    chars_per_token: float = Field(3.6, gt=0)
    """Prior for estimating prompt tokens from characters."""
    max_output_tokens: int | None = Field(None, gt=0)
    """The longest reply agents should ask for (Anthropic's ``max_tokens`` in ``/v1/models``, the
    output limit ``turnout agents`` writes); unset: a quarter of the window, at most 32,000."""
    display_name: str | None = None
    """A human-readable name for model pickers (Anthropic's ``display_name``); unset: ``name``."""
    deployments: tuple[DeploymentConfig, ...] = Field(min_length=1)


class GroupConfig(StrictModel):
    """A model group: one client-facing name over several models, the member chosen per request
    (docs/routing.md, "Model groups")."""

    name: str
    members: tuple[str, ...] = Field(min_length=2)
    """Model names (not aliases); the first is the default member unless ``default`` names another."""
    default: str | None = None
    aliases: tuple[str, ...] = ()
    display_name: str | None = None
    max_output_tokens: int | None = Field(None, gt=0)
    """As for a model; unset: the smallest of the members' (every member must honour it)."""
    reasoning_floor_b: float | None = Field(None, gt=0)
    """A request that asks for deep reasoning (OpenAI ``reasoning_effort`` or Responses
    ``reasoning.effort`` ``"high"``, or an Anthropic ``thinking`` budget of at least
    ``REASONING_BUDGET_TOKENS``) asks for a member of at least this many billion parameters, as if it
    sent ``x-turnout-min-params-b``; unset: reasoning does not choose the member."""
    profile: str | None = None
    """The routing profile that chooses among the members (built-in or ``[[profiles]]``, like the
    gateway's own ``profile``); unset: the gateway's profile, as an admin switches it."""
    prefer_default: float = Field(0.25, ge=0, le=10)
    """How much better another member must score than the default member to answer instead (the
    ``cost`` profile's score is the inverse of the predicted time to first token, so 0.25: predicted
    at least 1.25x faster); 0: the cost model alone chooses among the members."""

    @property
    def ordered(self) -> tuple[str, ...]:
        """The members, the default first."""
        first = self.default or self.members[0]
        return (first, *(m for m in self.members if m != first))
