"""Typed settings: a TOML config file plus ``TURNOUT_*`` environment overrides.

Precedence, highest first: environment (``TURNOUT_PORT``, ``TURNOUT_HOST``, ``TURNOUT_PROFILE``,
``TURNOUT_LOG_FORMAT``, ... and nested keys with ``__``, e.g. ``TURNOUT_LIMITS__MAX_BODY_BYTES``),
then the config file, then the defaults below. Settings are read once by the CLI and passed to
``create_app``; nothing reads them at import time.
"""

from __future__ import annotations

import hashlib
import ipaddress
import tomllib
from pathlib import Path
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, HttpUrl, SecretStr, ValidationError, model_validator
from pydantic_settings import BaseSettings, PydanticBaseSettingsSource, SettingsConfigDict

from backends.engine_profiles import ProfileNotFound, load_profile
from gateway.traffic import TrafficRecorder
from policies import BUILTIN_PROFILES, Architecture, EngineKind, Profile, ProfileError, build_profile
from policies.engine_profile import EngineProfile, ProfileSchemaError


class ConfigError(Exception):
    """A config file that cannot be read or does not validate; the message names the field."""


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


class Timeouts(_Strict):
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


class CircuitConfig(_Strict):
    """Circuit breaking (``backends.breaker``): a backend failing this many requests in a row gets
    none for a cool-down, then one trial; a failed trial doubles the cool-down, a success closes it."""

    failures: int = Field(3, ge=1)
    cool_down_s: float = Field(5.0, gt=0)
    max_cool_down_s: float = Field(60.0, gt=0)


class SimulatorConfig(_Strict):
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


class BackendConfig(_Strict):
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


class DeploymentConfig(_Strict):
    """Where a model is served: on which backend, under which upstream name, with which window."""

    backend: str
    """The ``id`` of a configured backend."""
    upstream_name: str
    """The model name that engine answers to (vLLM ``--served-model-name``, llama ``--alias``)."""
    context_window: int | None = Field(None, gt=0)
    """Tokens per request; the smaller of this and what the engine reports is used."""
    quantization: str | None = None


class ModelConfig(_Strict):
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


class GroupConfig(_Strict):
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


class ProfileConfig(_Strict):
    """A routing profile of your own, built from the registered filters and scorers."""

    name: str
    filters: tuple[str, ...] = ("engine-supports", "healthy", "context-fits")
    scorers: dict[str, float] = Field(min_length=1)
    """Scorer name -> positive weight (see policies/scorers.py for the registry)."""


class RecordConfig(_Strict):
    """Live traffic written as a replayable trace (``gateway.traffic``; docs/replay.md)."""

    path: Path | None = None
    """Where to append it (turnout's trace format, one line per answered request, no text of any
    prompt); unset: nothing is recorded."""
    max_mb: float = Field(64.0, gt=0)
    """The file rotates at this size (``path`` -> ``path.1`` -> ...)."""
    keep: int = Field(3, ge=0, le=100)
    """Rotated files kept."""
    on_start: bool = True
    """Record from start-up; false: only once an admin switches it on (the policy page). Each replica
    records what it answered to its own file."""

    def recorder(self) -> TrafficRecorder:
        """A recorder writing to ``path`` (which must be set)."""
        assert self.path is not None
        return TrafficRecorder(self.path, max_bytes=int(self.max_mb * (1 << 20)), keep=self.keep)


class StateConfig(_Strict):
    """Where sessions and slot leases live, and how long."""

    url: str | None = Field(None, pattern=r"^(redis|rediss|unix)://")
    """A Redis URL (``redis://127.0.0.1:6379/0``) to share sessions, slot leases, timelines, the
    decision log and the API keys' limits between replicas; unset: in this process's memory."""
    prefix: str = Field("turnout", pattern=r"^[A-Za-z0-9_.-]+$")
    """Namespace of every Redis key (``<prefix>:v1:...``)."""
    timeout_s: float = Field(0.25, gt=0, le=10)
    """How long one Redis call may take before the gateway routes on its local state instead (it
    tries Redis again once a second): a slow Redis costs a request at most this much, once."""

    max_sessions: int = Field(10_000, gt=0)
    session_ttl_s: float = Field(6 * 3600, gt=0)
    """A session unseen this long is forgotten."""
    timeline_turns: int = Field(20_000, gt=0)
    """Turns kept across all session timelines in this process (about 0.5 KB each; the sessions
    that went longest without a turn lose their oldest first; each keeps at most its newest 500)."""
    decision_log_size: int = Field(1000, gt=0)
    """Decisions kept for ``GET /admin/api/decisions``."""
    lease_idle_s: float = Field(600.0, gt=0)
    """A llama.cpp slot lease idle this long has expired: another session takes the slot at no cost
    (before that, taking it costs the holder's next turn in proportion to how recently it was used)."""
    prefix_index_tokens: int = Field(1_000_000, gt=0)
    """Prompt tokens the prefix index tracks per backend (about 0.3 bytes each; oldest prompts out first)."""


class AdminConfig(_Strict):
    """The admin dashboard at ``/admin`` and its JSON API under ``/admin/api/``."""

    token: SecretStr | None = None
    """Logs in to the dashboard (a form that sets an HttpOnly session cookie) and authorises scripts
    (``Authorization: Bearer <token>``). Unset: a random token is made at start-up and logged, which
    is allowed only when the gateway listens on loopback."""
    enabled: bool = True
    redact_session_ids: bool = False
    """Show and log sessions by a hash only, never by the names clients send (``x-session-id``, an
    agent's session header, ``prompt_cache_key``, ``user``, ``metadata.user_id``: these may be user
    ids or e-mail addresses); unset: the dashboard shows each session by its own name."""


class KeyConfig(_Strict):
    """One API key: its SHA-256 (``turnout keys hash``) or the key itself (hashed at load), its limits."""

    name: str
    sha256: str | None = Field(None, pattern=r"^[0-9a-f]{64}$")
    key: SecretStr | None = None
    models: tuple[str, ...] | None = None
    """Models (names, not aliases) this key may use; unset: all."""
    requests_per_minute: int | None = Field(None, gt=0)
    concurrent: int | None = Field(None, gt=0)
    tokens_per_minute: int | None = Field(None, gt=0)

    @model_validator(mode="after")
    def _one_secret(self) -> KeyConfig:
        if (self.sha256 is None) == (self.key is None):
            raise ValueError(f"key {self.name!r}: give exactly one of sha256 and key")
        return self

    @property
    def digest(self) -> str:
        if self.sha256 is not None:
            return self.sha256
        assert self.key is not None
        return hashlib.sha256(self.key.get_secret_value().encode()).hexdigest()


class AuthConfig(_Strict):
    """API keys for the agents' endpoints. No key: open (with a warning off loopback)."""

    keys: tuple[KeyConfig, ...] = ()
    keys_file: Path | None = None
    """A TOML file of ``[[keys]]`` tables, added to ``keys`` (keeps hashes out of the main config)."""

    def all_keys(self) -> tuple[KeyConfig, ...]:
        if self.keys_file is None:
            return self.keys
        try:
            data = tomllib.loads(self.keys_file.read_text(encoding="utf-8"))
        except (OSError, tomllib.TOMLDecodeError) as exc:
            raise ConfigError(f"auth.keys_file: cannot read {self.keys_file}: {exc}") from exc
        try:
            extra = tuple(KeyConfig.model_validate(k) for k in data.get("keys", []))
        except ValidationError as exc:
            raise ConfigError(f"auth.keys_file: {_describe(exc)}") from exc
        return self.keys + extra


class Limits(_Strict):
    """Request limits enforced by the gateway."""

    max_body_bytes: int = Field(16 * 1024 * 1024, gt=0)
    """Largest request body accepted; larger bodies get 413."""
    retries: int = Field(1, ge=0, le=5)
    """Extra attempts on another backend when an upstream fails before its first byte."""
    body_timeout_s: float = Field(30.0, gt=0)
    """A request body must arrive within this (a client trickling its body gets 408)."""
    max_header_bytes: int = Field(64 * 1024, gt=0)
    """Request headers larger than this in all get 431."""
    max_connections: int = Field(10_000, gt=0)
    """Connections the server holds at once; beyond them it answers 503 at once (uvicorn's
    ``limit_concurrency``; ``turnout serve`` only). Connections to the engines are bounded by this
    plus 64, so probes never wait for a connection behind requests."""
    shutdown_grace_s: float = Field(30.0, ge=0)
    """On SIGTERM, how long requests in flight may go on (new ones get 503); streams still running
    then end with their API's error event."""


class Settings(BaseSettings):
    """Everything the gateway needs to run."""

    model_config = SettingsConfigDict(
        env_prefix="TURNOUT_", env_nested_delimiter="__", extra="forbid", frozen=True
    )

    host: str = "127.0.0.1"
    port: int = Field(8484, ge=0, le=65535)
    profile: str = "cost"
    """The routing profile used for every request: a built-in one or one of ``profiles``."""
    log_format: Literal["auto", "json", "console"] = "auto"
    """``auto``: console on a TTY, JSON otherwise."""
    log_level: Literal["debug", "info", "warning", "error"] = "info"
    limits: Limits = Limits()
    state: StateConfig = StateConfig()
    record: RecordConfig = RecordConfig()
    admin: AdminConfig = AdminConfig()
    auth: AuthConfig = AuthConfig()
    profiles: tuple[ProfileConfig, ...] = ()
    backends: tuple[BackendConfig, ...] = ()
    models: tuple[ModelConfig, ...] = ()
    groups: tuple[GroupConfig, ...] = ()
    """Model groups (docs/routing.md): a name clients ask for, over several models."""

    @classmethod
    def settings_customise_sources(
        cls,
        settings_cls: type[BaseSettings],
        init_settings: PydanticBaseSettingsSource,
        env_settings: PydanticBaseSettingsSource,
        dotenv_settings: PydanticBaseSettingsSource,
        file_secret_settings: PydanticBaseSettingsSource,
    ) -> tuple[PydanticBaseSettingsSource, ...]:
        # The config file arrives as init kwargs; the environment overrides it.
        return (env_settings, init_settings)

    @model_validator(mode="after")
    def _profiles(self) -> Settings:
        for index, profile in enumerate(self.profiles):
            try:
                build_profile(profile.name, filters=profile.filters, scorers=profile.scorers)
            except ProfileError as exc:
                raise ValueError(f"profiles.{index}: {exc}") from exc
        known = {*BUILTIN_PROFILES, *(p.name for p in self.profiles)}
        if self.profile not in known:
            raise ValueError(f"profile: unknown profile {self.profile!r}; known: {', '.join(sorted(known))}")
        for group in self.groups:
            if group.profile is not None and group.profile not in known:
                raise ValueError(
                    f"groups.{group.name}.profile: unknown profile {group.profile!r};"
                    f" known: {', '.join(sorted(known))}"
                )
        return self

    def routing_profile(self, name: str | None = None) -> Profile:
        """The named profile (default: ``profile``), built-in or configured."""
        name = name or self.profile
        for profile in self.profiles:
            if profile.name == name:
                return build_profile(profile.name, filters=profile.filters, scorers=profile.scorers)
        return BUILTIN_PROFILES[name]

    def group_profiles(self) -> dict[str, Profile]:
        """Each model group that names its own routing profile: group -> that profile."""
        return {g.name: self.routing_profile(g.profile) for g in self.groups if g.profile is not None}

    @model_validator(mode="after")
    def _admin_token_off_loopback(self) -> Settings:
        if self.admin.enabled and self.admin.token is None and not is_loopback(self.host):
            raise ValueError(
                f"admin.token: required when the gateway listens on {self.host!r} (not loopback): the "
                "admin pages would be open to the network; set one (TURNOUT_ADMIN__TOKEN) or "
                "admin.enabled = false"
            )
        return self

    @model_validator(mode="after")
    def _cross_references(self) -> Settings:
        backend_ids = [b.id for b in self.backends]
        duplicates = {b for b in backend_ids if backend_ids.count(b) > 1}
        if duplicates:
            raise ValueError(f"backends: duplicate id {sorted(duplicates)[0]!r}")
        names: set[str] = set()
        for model in self.models:
            for name in (model.name, *model.aliases):
                if name in names:
                    raise ValueError(f"models: name or alias {name!r} is used twice")
                names.add(name)
            for deployment in model.deployments:
                if deployment.backend not in backend_ids:
                    raise ValueError(
                        f"models.{model.name}.deployments: unknown backend {deployment.backend!r}"
                        f" (configured: {', '.join(backend_ids) or 'none'})"
                    )
        model_names = {m.name for m in self.models}
        for group in self.groups:
            for name in (group.name, *group.aliases):
                if name in names:
                    raise ValueError(f"groups: name or alias {name!r} is used twice")
                names.add(name)
            unknown = [
                m
                for m in (*group.members, *([group.default] if group.default else []))
                if m not in model_names
            ]
            if unknown:
                raise ValueError(
                    f"groups.{group.name}: {unknown[0]!r} is not a configured model name"
                    f" (models: {', '.join(sorted(model_names)) or 'none'})"
                )
            if group.default and group.default not in group.members:
                raise ValueError(f"groups.{group.name}: default {group.default!r} is not one of its members")
            if len(set(group.members)) != len(group.members):
                raise ValueError(f"groups.{group.name}: a member is listed twice")
        return self

    def engine_profiles(self) -> dict[str, EngineProfile]:
        """The engine profile of each backend that names one, by backend id."""
        loaded = {b.id: b.load_engine_profile() for b in self.backends}
        return {backend_id: profile for backend_id, profile in loaded.items() if profile is not None}

    def backend(self, backend_id: str) -> BackendConfig:
        return next(b for b in self.backends if b.id == backend_id)


def is_loopback(host: str) -> bool:
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


def _describe(error: ValidationError) -> str:
    lines = []
    for item in error.errors():
        where = ".".join(str(part) for part in item["loc"]) or "config"
        lines.append(f"{where}: {item['msg']}")
    return "; ".join(lines)


def served_models(settings: Settings, name: str) -> list[ModelConfig]:
    """The model called ``name`` (or an alias), or a model group's members (what a replay of ``name``
    runs on); :class:`ConfigError` naming the served ones when there is none."""
    for model in settings.models:
        if model.name == name or name in model.aliases:
            return [model]
    by_name = {m.name: m for m in settings.models}
    for group in settings.groups:
        if group.name == name or name in group.aliases:
            return [by_name[m] for m in group.ordered]
    known = ", ".join([*(m.name for m in settings.models), *(g.name for g in settings.groups)])
    raise ConfigError(f"the fleet serves no model {name!r}; it serves {known}")


def load_settings(path: Path | None = None, **overrides: Any) -> Settings:
    """Read ``path`` (TOML) if given, apply the environment, and validate.

    Raises :class:`ConfigError` with a message naming each bad field.
    """
    data: dict[str, Any] = {}
    if path is not None:
        try:
            data = tomllib.loads(path.read_text(encoding="utf-8"))
        except OSError as exc:
            raise ConfigError(f"cannot read config file {path}: {exc.strerror}") from exc
        except tomllib.TOMLDecodeError as exc:
            raise ConfigError(f"{path}: not valid TOML: {exc}") from exc
    data.update(overrides)
    try:
        return Settings(**data)
    except ValidationError as exc:
        source = f"{path}: " if path is not None else ""
        raise ConfigError(f"{source}{_describe(exc)}") from exc
