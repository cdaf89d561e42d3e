"""The routing benchmark's workloads (``bench/routing.py``): the fleet and trace paths, the profile
sets each row replays, and ``WORKLOADS``, every row's trace generator (and its seeded draws for the
generated ones, ``SEEDS`` of them pooled into one row). ``bench/predictions.py`` replays the same
workloads.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from gateway.replay.generate import agent_trace, chat_trace, contention_trace, mixed_trace, without_sessions
from gateway.replay.traces import TraceRequest, read_trace
from policies.profiles import PEER_PROFILES

REPO = Path(__file__).resolve().parents[1]
MOONCAKE = REPO.parent / "shared" / "traces" / "mooncake-conversation.jsonl"
SIXTEEN = REPO / "bench" / "fleets" / "sixteen.toml"
EIGHT_VLLM = REPO / "bench" / "fleets" / "eight-vllm.toml"
EIGHT_LLAMA = REPO / "bench" / "fleets" / "eight-llama.toml"
PEERS = tuple(PEER_PROFILES)
"""The published routers (``policies.peers``): every row replays them beside ``cost``."""
PROFILES = ("cost", "least-loaded", "prefer-vllm", "prefer-llamacpp", "round-robin", *PEERS)
CONTENTION_PROFILES = ("cost", "prefer-vllm", "prefer-llamacpp", "least-loaded", *PEERS)
CONTENTION_AGENTS = (1, 2, 4, 8)
MOONCAKE_LOAD = 0.7
MOONCAKE_PROFILES = ("cost", "least-loaded", "prefer-vllm", *PEERS)
HOMOGENEOUS_PROFILES = ("cost", "least-loaded", "round-robin", *PEERS)
"""On one engine kind "prefer-vllm" / "prefer-llamacpp" mean nothing: the peers' home ground."""
"""Not prefer-llamacpp: at 70% of both engines' capacity llama.cpp alone (31% of it) is loaded 2.2x,
its queue grows for the whole trace (hours of TTFT) and its replay takes many minutes to say so."""
MODEL = "replay"
SEEDS = 32
"""Draws of each generated workload pooled into its row (bench/routing.py's module docstring)."""
SCHEDULES = 8
"""Sampled hindsight schedules per run; the best of them and the oracle's is ``best-schedule``."""


@dataclass(frozen=True)
class Workload:
    name: str
    scaling: str
    make: Callable[[bool], list[TraceRequest]]
    profiles: tuple[str, ...] = PROFILES
    fleet: Path | None = None
    """A turnout config to replay on (``--backends``); None: the two-engine workstation."""
    load: float | None = None
    """Set the arrival rate so the prompts are this share of the fleet's prefill capacity."""
    seeded: Callable[[int], list[TraceRequest]] | None = None
    """The same workload drawn with another seed (``SEEDS``; None: a recorded trace, one draw)."""
    homogeneous: bool = False
    """One engine kind only (issue #45: where the published routers are at home)."""
    draws: int | None = None
    """The validation set: this row's own draw count (0 to ``draws - 1``); None: the set's."""


def _mooncake(quick: bool) -> list[TraceRequest]:
    return read_trace(MOONCAKE, "mooncake", model=MODEL, limit=600 if quick else None)


def _contention(agents: int, sessions: bool) -> Callable[[bool], list[TraceRequest]]:
    return lambda quick: _draw(agents, sessions, 4 if quick else 12, 0)


def _contention_seeded(agents: int, sessions: bool) -> Callable[[int], list[TraceRequest]]:
    return lambda seed: _draw(agents, sessions, 12, seed)


def _draw(agents: int, sessions: bool, turns: int, seed: int) -> list[TraceRequest]:
    """Seed 0 is the trace seeded by the agent count (the table's row before rows pooled draws)."""
    requests = contention_trace(agents=agents, turns=turns, seed=agents + 100 * seed, model=MODEL)
    return requests if sessions else without_sessions(requests)


def _fleet16(quick: bool) -> list[TraceRequest]:
    return contention_trace(agents=32, turns=4 if quick else 12, seed=32, model=MODEL, oneshot_every=1.0)


def _contention_workloads() -> tuple[Workload, ...]:
    out = []
    for agents in CONTENTION_AGENTS:
        for sessions in (True, False):
            name = f"contention-{agents}" + ("" if sessions else "-nosession")
            scaling = (
                f"{agents} agents x 12 turns on 2 llama.cpp slots, 6k shared system prompt, +1.2k-3.8k "
                "tokens a turn, answers 80-400, one-shots of 1.5k-9k tokens every ~7 s; "
                + ("x-session-id given" if sessions else "no session ids")
            )
            out.append(
                Workload(
                    name,
                    scaling,
                    _contention(agents, sessions),
                    profiles=CONTENTION_PROFILES,
                    seeded=_contention_seeded(agents, sessions),
                )
            )
    return tuple(out)


WORKLOADS = (
    Workload(
        "agent",
        "2 agents x 30 turns, 4k -> 60k tokens, answers 64-256 tokens",
        lambda quick: agent_trace(agents=2, turns=10 if quick else 30, seed=0, model=MODEL),
    ),
    Workload(
        "chat",
        "100 independent requests over 60 s, prompts 2.1k-5.1k tokens, answers 32-320",
        lambda quick: chat_trace(requests=40 if quick else 100, duration=60.0, seed=0, model=MODEL),
        seeded=lambda seed: chat_trace(requests=100, duration=60.0, seed=seed, model=MODEL),
    ),
    Workload(
        "mixed",
        "2 agents x 16 turns (4k -> 60k) + 80 chat requests over 60 s",
        lambda quick: mixed_trace(
            agents=2, turns=6 if quick else 16, requests=30 if quick else 80, seed=0, model=MODEL
        ),
        seeded=lambda seed: mixed_trace(agents=2, turns=16, requests=80, seed=seed, model=MODEL),
    ),
    Workload(
        "mooncake",
        f"the Mooncake conversation trace, full token lengths, arrivals at {MOONCAKE_LOAD:.0%} of the "
        "fleet's prefill capacity",
        _mooncake,
        profiles=MOONCAKE_PROFILES,
        load=MOONCAKE_LOAD,
    ),
    *_contention_workloads(),
    Workload(
        "chat-8vllm",
        "the chat workload at 8x the rate (800 requests over 60 s) on 8 vLLM replicas, a dense model, "
        "prefix caching on",
        lambda quick: chat_trace(requests=160 if quick else 800, duration=60.0, seed=0, model=MODEL),
        profiles=HOMOGENEOUS_PROFILES,
        fleet=EIGHT_VLLM,
        seeded=lambda seed: chat_trace(requests=800, duration=60.0, seed=seed, model=MODEL),
        homogeneous=True,
    ),
    Workload(
        "mixed-8vllm",
        "16 agents x 16 turns (4k -> 60k) + 640 chat requests over 60 s on 8 vLLM replicas, a dense "
        "model, prefix caching on",
        lambda quick: mixed_trace(
            agents=16, turns=6 if quick else 16, requests=240 if quick else 640, seed=0, model=MODEL
        ),
        profiles=HOMOGENEOUS_PROFILES,
        fleet=EIGHT_VLLM,
        seeded=lambda seed: mixed_trace(agents=16, turns=16, requests=640, seed=seed, model=MODEL),
        homogeneous=True,
    ),
    Workload(
        "mooncake-8vllm",
        f"the Mooncake conversation trace at {MOONCAKE_LOAD:.0%} of 8 vLLM replicas' prefill capacity "
        "(a dense model, prefix caching on)",
        _mooncake,
        profiles=HOMOGENEOUS_PROFILES,
        fleet=EIGHT_VLLM,
        load=MOONCAKE_LOAD,
        homogeneous=True,
    ),
    *(
        Workload(
            f"contention-{agents}-8llama",
            f"{agents} agents x 12 turns on 8 llama-servers of 2 slots ({agents // 16 or 1} a slot), 6k "
            "shared system prompt, +1.2k-3.8k tokens a turn, one-shots every ~7 s; x-session-id given",
            _contention(agents, True),
            profiles=HOMOGENEOUS_PROFILES,
            fleet=EIGHT_LLAMA,
            seeded=_contention_seeded(agents, True),
            homogeneous=True,
        )
        for agents in (16, 32)
    ),
    Workload(
        "fleet-16",
        "32 agents x 12 turns + one-shots every ~1 s on 16 backends (4 vLLM, 12 llama.cpp x 2 slots)",
        _fleet16,
        profiles=CONTENTION_PROFILES,
        fleet=SIXTEEN,
    ),
)
