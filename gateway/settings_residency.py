"""The residency sets (``[[residency]]`` in the config file): deployments that share GPU memory and
cannot all be awake at once, and how each one gives the GPUs back and takes them again
(``gateway.residency``; docs/residency.md)."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Literal

from pydantic import BaseModel, ConfigDict, Field, model_validator

from gateway.settings_fleet import BackendConfig
from policies import EngineKind


class ResidencyMember(BaseModel):
    """One member: a backend, and how it sleeps."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    backend: str
    """The ``id`` of a configured vLLM or llama.cpp backend."""
    sleep_level: Literal[1, 2] = 1
    """vLLM: ``POST /sleep?level=N``. 1 parks the weights in host RAM (a wake takes ~1 s), 2 drops
    them (a wake reloads them from disk: ~15 s for 54 GB from the page cache); both drop the KV and
    prefix caches (docs/calibrate.md, the H100 measurement)."""
    router_model: str | None = None
    """llama.cpp in router mode (``--models-dir``/``--models-preset``, ``--no-models-autoload``): the
    model this backend is, as ``GET /models`` lists it; requests and probes name it. Unset: the
    backend's deployment's ``upstream_name``."""
    save_slots: bool = True
    """llama.cpp: save the slots that hold a conversation before an unload and restore them after the
    next load (``POST /slots/N?action=save|restore``; llama-server needs ``--slot-save-path``)."""


class ResidencyConfig(BaseModel):
    """A set of deployments sharing the GPUs: at most one is awake; an admin switches which."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    name: str = Field(pattern=r"^[A-Za-z0-9_.-]+$")
    members: tuple[ResidencyMember, ...] = Field(min_length=2)
    awake: str | None = None
    """The member awake when the gateway starts (the others are taken as asleep); unset: the first."""
    wait_s: float = Field(30.0, ge=0)
    """The longest a request waits for a member a switch is waking, when no awake member can take it
    (then it is refused: 503 with the reason). Behind Envoy keep it under the ext_proc
    ``message_timeout``."""
    drain_s: float = Field(600.0, gt=0)
    """The longest a switch waits for the requests in flight on the member it frees; past it the
    switch is called off and that member keeps the GPUs (no stream is ever cut)."""
    step_timeout_s: float = Field(600.0, gt=0)
    """The longest one step (free, wake, the probe after it) may take before the switch fails."""
    on_demand: bool = False
    """A request whose model only an asleep member of this set serves wakes that member (a switch by
    ``on-demand``, drained like any) and waits for it, at most ``wait_s``; off: it is refused (503,
    asleep). Two models that both need the GPUs then take turns by demand, as llama-swap swaps them:
    each turn costs a switch (docs/residency.md)."""
    min_awake_s: float = Field(5.0, ge=0)
    """On demand: a member just woken keeps the GPUs at least this long before demand moves them
    again, so the requests it was woken for begin and two models asked for in turn do not switch at
    every request (requests for the other member wait meanwhile, within ``wait_s``)."""

    @property
    def first_awake(self) -> str:
        return self.awake or self.members[0].backend

    @model_validator(mode="after")
    def _members(self) -> ResidencyConfig:
        ids = [m.backend for m in self.members]
        if len(set(ids)) != len(ids):
            raise ValueError(f"residency.{self.name}: a member is listed twice")
        if self.awake is not None and self.awake not in ids:
            raise ValueError(f"residency.{self.name}: awake {self.awake!r} is not one of its members")
        if self.on_demand and self.wait_s <= 0:
            raise ValueError(f"residency.{self.name}: on_demand needs wait_s > 0 (the wait for the switch)")
        return self


def check_residency(sets: Sequence[ResidencyConfig], backends: Sequence[BackendConfig]) -> None:
    """Each member is a configured vLLM or llama.cpp backend, in one set at most."""
    kinds = {b.id: b.kind for b in backends}
    seen: dict[str, str] = {}
    names = [s.name for s in sets]
    if len(set(names)) != len(names):
        raise ValueError("residency: two sets have the same name")
    for one in sets:
        for member in one.members:
            kind = kinds.get(member.backend)
            if kind is None:
                raise ValueError(
                    f"residency.{one.name}: unknown backend {member.backend!r}"
                    f" (configured: {', '.join(kinds) or 'none'})"
                )
            if kind not in (EngineKind.VLLM, EngineKind.LLAMACPP):
                raise ValueError(
                    f"residency.{one.name}: {member.backend!r} is {kind.value}: only vLLM (sleep mode) and"
                    " llama.cpp (router mode) can give the GPUs back"
                )
            if member.backend in seen:
                raise ValueError(
                    f"residency.{one.name}: {member.backend!r} is already in the set {seen[member.backend]!r}"
                )
            seen[member.backend] = one.name
