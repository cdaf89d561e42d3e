"""Shared by the cost model's tests (``test_cost*.py``): the two deployments (a hybrid llama.cpp
with two slots, a hybrid vLLM), their snapshots, a request's features, a session holding slot 0 and
the prefix matches around it, a learned state with no RAM cache, ``llama()`` (an estimate on the
llama.cpp backend) and the CPU-MoE engine profile."""

from __future__ import annotations

from types import MappingProxyType

from msgspec.structs import replace

from backends.engine_profiles import load_profile
from policies import (
    Architecture,
    BackendSnapshot,
    Deployment,
    Endpoint,
    EngineKind,
    Health,
    RequestFeatures,
)
from policies.cost import estimate
from policies.decision import Estimate, Outcome
from policies.engine_profile import linear_profile
from policies.ewma import Ewma
from policies.learning import LearnedState, learn
from policies.types import PrefixMatch, SessionSource, SessionView, SlotLease, SlotMatch, SlotState, Usage

LLAMA = Deployment("m", "llama", "up", 65536, Architecture.HYBRID)
VLLM = Deployment("m", "vllm", "up", 94000, Architecture.HYBRID)


def llama_snapshot(busy: tuple[bool, ...] = (False, False), queued: int = 0) -> BackendSnapshot:
    slots = tuple(SlotState(i, 32768, b) for i, b in enumerate(busy))
    return BackendSnapshot(
        "llama",
        EngineKind.LLAMACPP,
        Health.READY,
        0.0,
        (LLAMA,),
        running=sum(busy),
        queued=queued,
        slots=slots,
        total_slots=len(busy),
    )


def vllm_snapshot(running: int = 0, queued: int = 0) -> BackendSnapshot:
    return BackendSnapshot(
        "vllm", EngineKind.VLLM, Health.READY, 0.0, (VLLM,), running=running, queued=queued
    )


def features(prompt: int = 10_000, source: SessionSource = SessionSource.HEADER) -> RequestFeatures:
    return RequestFeatures("m", Endpoint.CHAT, prompt, 100, True, "s", source)


SESSION = SessionView("s", "llama", 0, prompt_tokens=9000, turns=3)

HELD = PrefixMatch(
    (SlotMatch(0, 9000, whole=True), SlotMatch(1, 0)), recent=9000, recent_whole=True, recent_held=9000
)

NOTHING = PrefixMatch((SlotMatch(0, 0), SlotMatch(1, 0)), recent=0)

NO_RAM = learn(
    LearnedState(),
    Outcome(
        "llama",
        "m",
        EngineKind.LLAMACPP,
        Usage(9000, 8, 0),
        1.0,
        2.0,
        30_000,
        9000,
        True,
        predicted=Estimate(0, 0.0, 0.0, 0.0, source="ram", ram_tokens=8500, ram_span=9000),
    ),  # a restore of 8500 tokens expected, none came: the server keeps nothing (--cache-ram 0)
    LLAMA,
)


def llama(
    match: PrefixMatch = HELD,
    leases: tuple[SlotLease, ...] = (),
    *,
    session: SessionView | None = SESSION,
    learned: LearnedState | None = None,
    snapshot: BackendSnapshot | None = None,
    source: SessionSource = SessionSource.HEADER,
    now: float = 10.0,
) -> Estimate:
    return estimate(
        features(source=source),
        LLAMA,
        snapshot or llama_snapshot(),
        session=session,
        leases=leases,
        learned=learned or LearnedState(),
        match=match,
        now=now,
        lease_idle_s=600.0,
    )


CPU_MOE = load_profile("workstation-llamacpp-flash-next-cpu-moe")
MOE = replace(LLAMA, profile=CPU_MOE)


def seed_snapshots() -> list[BackendSnapshot]:
    """A vLLM that prefills fast and decodes slowly and a llama.cpp that prefills slowly and decodes
    fast (the seeds' single-5090 shapes: 6,600 / 64 and 3,000 / 109 tokens a second)."""
    vllm = replace(VLLM, profile=linear_profile("vllm", 6600, 64))
    fast = replace(LLAMA, profile=linear_profile("llamacpp", 3000, 109))
    return [replace(vllm_snapshot(), deployments=(vllm,)), replace(llama_snapshot(), deployments=(fast,))]


CODEX_500 = LearnedState(clients=MappingProxyType({"m codex": Ewma(500.0, 256.0, samples=5)}))
"""What was learned of a client (``codex``) whose answers run to 500 tokens."""
