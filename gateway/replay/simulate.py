"""``turnout replay --clock virtual``: every profile, the oracle and the lower bound, in virtual time.

Each profile gets a fresh fleet of engine models and a fresh gateway (``virtual.GatewayReplay``), the
oracle its own (``virtual_oracle.OracleReplay``), and so do the sampled schedules and the look-ahead
oracle when asked for; the lower bound comes from the trace
(``yardsticks.lower_bounds``). The report is a function of the trace and the options alone; the
wall seconds each run took are returned beside it.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from functools import partial

from gateway.replay.fleets import sim_configs
from gateway.replay.results import BEST_SCHEDULE, LOOKAHEAD, ORACLE, Result
from gateway.replay.traces import TraceRequest
from gateway.replay.virtual import GatewayReplay
from gateway.replay.virtual_lookahead import LookaheadOracleReplay
from gateway.replay.virtual_oracle import OracleReplay, SampledOracleReplay
from gateway.replay.virtual_world import VirtualOptions, World
from gateway.replay.yardsticks import lower_bounds
from gateway.settings import Settings, served_models


@dataclass
class Simulated:
    """What the runs gave: results per profile (and ``oracle``), the lower bounds, and per run its
    simulated and wall seconds."""

    runs: dict[str, list[Result]] = field(default_factory=dict)
    bounds: list[float | None] = field(default_factory=list)
    simulated_s: dict[str, float] = field(default_factory=dict)
    wall_s: dict[str, float] = field(default_factory=dict)

    @property
    def speedup(self) -> float:
        """Simulated seconds per wall second, over every run."""
        wall = sum(self.wall_s.values())
        return sum(self.simulated_s.values()) / wall if wall > 0 else 0.0


def simulate(
    requests: Sequence[TraceRequest],
    profiles: Sequence[str],
    settings_for: Callable[[str], Settings],
    model: str,
    options: VirtualOptions,
    *,
    oracle: bool = True,
    schedules: int = 0,
    lookahead: bool = False,
    on_done: Callable[[str, World], None] | None = None,
) -> Simulated:
    """Replay ``requests`` once per profile (``settings_for(profile)``: the gateway and its fleet), then
    with the oracle on the same fleet (module docstring); with ``schedules``, also that many sampled
    hindsight schedules (``SampledOracleReplay``, seeds 1 to ``schedules``), of which the best by mean
    TTFT, the oracle's included, is the run ``best-schedule``; with ``lookahead``, the look-ahead
    oracle's run too (``look-ahead``: ``virtual_lookahead``, slow on a long trace)."""
    out = Simulated()
    settings = settings_for(profiles[0] if profiles else "cost")
    configs = sim_configs(settings, model)
    # the oracle and the bound place the model where the gateway can: on its deployments only
    served = {d.backend for m in served_models(settings, model) for d in m.deployments}
    serving = {name: config for name, config in configs.items() if name in served}
    worlds: list[tuple[str, Callable[[], World]]] = [
        (p, partial(GatewayReplay, requests, settings_for(p), configs, options)) for p in profiles
    ]
    if oracle:
        worlds.append((ORACLE, partial(OracleReplay, requests, serving, options)))
        worlds += [
            (f"{BEST_SCHEDULE}#{seed}", partial(SampledOracleReplay, requests, serving, options, seed=seed))
            for seed in range(1, schedules + 1)
        ]
        if lookahead:
            worlds.append((LOOKAHEAD, partial(LookaheadOracleReplay, requests, serving, options)))
    for name, make in worlds:
        world = make()
        out.runs[name] = world.run()
        out.simulated_s[name], out.wall_s[name] = world.simulated_s, world.wall_s
        if on_done is not None:
            on_done(name, world)
    if oracle and schedules:
        sampled = [ORACLE, *(f"{BEST_SCHEDULE}#{seed}" for seed in range(1, schedules + 1))]
        best = min(sampled, key=lambda name: _mean_ttft(out.runs[name]))
        out.runs[BEST_SCHEDULE] = out.runs[best]
        out.simulated_s[BEST_SCHEDULE] = out.simulated_s[best]
        out.wall_s[BEST_SCHEDULE] = sum(out.wall_s.pop(name) for name in sampled[1:])
        for name in sampled[1:]:
            del out.runs[name], out.simulated_s[name]
    out.bounds = lower_bounds(requests, serving, options.overhead_s, options.block_tokens)
    return out


def _mean_ttft(results: Sequence[Result]) -> float:
    """Mean TTFT of a schedule that answered every request (else infinite: it lost some)."""
    ttfts = [r.ttft_s for r in results if r.ok and r.ttft_s is not None]
    return sum(ttfts) / len(ttfts) if ttfts and len(ttfts) == len(results) else float("inf")
