"""Typed settings: a TOML config file plus ``TURNOUT_*`` environment overrides.

Precedence, highest first: environment (``TURNOUT_PORT``, ``TURNOUT_HOST``, ``TURNOUT_PROFILE``,
``TURNOUT_LOG_FORMAT``, ... and nested keys with ``__``, e.g. ``TURNOUT_LIMITS__MAX_BODY_BYTES``),
then the config file, then the defaults below. Settings are read once by the CLI and passed to
``create_app``; nothing reads them at import time. The fleet's parts (backends, models, model groups)
are defined in ``gateway.settings_fleet`` and re-exported here.
"""

from __future__ import annotations

import hashlib
import ipaddress
import tomllib
from pathlib import Path
from typing import Any, Literal

from pydantic import Field, SecretStr, ValidationError, model_validator
from pydantic_settings import BaseSettings, PydanticBaseSettingsSource, SettingsConfigDict

from gateway.settings_fleet import BackendConfig as BackendConfig
from gateway.settings_fleet import CircuitConfig as CircuitConfig
from gateway.settings_fleet import DeploymentConfig as DeploymentConfig
from gateway.settings_fleet import GroupConfig as GroupConfig
from gateway.settings_fleet import ModelConfig as ModelConfig
from gateway.settings_fleet import SimulatorConfig as SimulatorConfig
from gateway.settings_fleet import StrictModel
from gateway.settings_fleet import Timeouts as Timeouts
from gateway.settings_residency import ResidencyConfig as ResidencyConfig
from gateway.settings_residency import ResidencyMember as ResidencyMember
from gateway.settings_residency import check_residency
from gateway.traffic import TrafficRecorder
from policies import BUILTIN_PROFILES, Profile, ProfileError, build_profile
from policies.engine_profile import EngineProfile


class ConfigError(Exception):
    """A config file that cannot be read or does not validate; the message names the field."""


class ProfileConfig(StrictModel):
    """A routing profile of your own, built from the registered filters and scorers."""

    name: str
    filters: tuple[str, ...] = ("engine-supports", "healthy", "context-fits")
    scorers: dict[str, float] = Field(min_length=1)
    """Scorer name -> positive weight (see policies/scorers.py for the registry)."""
    warms: bool = False
    """Warm a free llama.cpp slot in the background for a session's next turn where that pays
    (``policies.warm``; the built-in ``cost`` profiles do)."""

    def build(self) -> Profile:
        return build_profile(self.name, filters=self.filters, scorers=self.scorers, warms=self.warms)


class RecordConfig(StrictModel):
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


class StateConfig(StrictModel):
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


class AdminConfig(StrictModel):
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


class KeyConfig(StrictModel):
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


class AuthConfig(StrictModel):
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


class Limits(StrictModel):
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
    keep_alive_s: int = Field(120, ge=1)
    """How long an idle client connection is kept open for its next request (uvicorn's
    ``timeout_keep_alive``; ``turnout serve`` only). Longer than common clients' pools keep one
    (httpx and the OpenAI/Anthropic SDKs 5 s, Node's undici 4 s, aiohttp 15 s, nginx's upstream pool
    60 s, Go and Rust's reqwest 90 s), so such a client does not send a request down a connection the
    gateway is closing at that moment: with uvicorn's 5 s, an agent that came back after ~5 s of tool
    calls now and then got a reset instead of an answer. Idle connections count against
    ``max_connections``."""


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
    residency: tuple[ResidencyConfig, ...] = ()
    """Deployments that share the GPUs, one awake at a time (docs/residency.md)."""

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
                profile.build()
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
                return profile.build()
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
        check_residency(self.residency, self.backends)
        return self

    def residency_member(self, backend_id: str) -> ResidencyMember | None:
        """The residency member that ``backend_id`` is, if any."""
        return next((m for s in self.residency for m in s.members if m.backend == backend_id), None)

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
    """Each error as ``field.path: what is wrong``; a check across fields (a model naming an unknown
    backend) names its own fields, so pydantic's "Value error, " and the model's empty location go."""
    lines = []
    for item in error.errors():
        message = str(item["msg"]).removeprefix("Value error, ")
        where = ".".join(str(part) for part in item["loc"])
        lines.append(f"{where}: {message}" if where else message)
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
