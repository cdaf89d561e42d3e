"""The hindsight oracle in virtual time: ``oracle``'s choice, made on the engine models themselves.

Each request, when it is sent, asks every engine what it would get there now (``whatif_vllm``, and
``whatif_slots`` for every llama.cpp slot), scores the candidates as the wall-clock oracle does
(``oracle.choose``: now + the conversation's future + what evicting a slot's other conversation
costs it) and goes to the best, pinned to its slot. It pays the gateway's ``overhead_s`` like every
profile, and each decision sees the engines as the previous one left them.
"""

from __future__ import annotations

import math
import random
from collections.abc import Mapping, Sequence

from backends.sim import SimConfig
from backends.sim.llama_engine import LlamaEngine
from backends.sim.task import SimTask
from backends.sim.vllm_engine import VllmEngine
from backends.sim.whatif import whatif_slots, whatif_vllm
from gateway.replay.oracle import Candidate, choose, engines_of, horizons, owners, scores
from gateway.replay.traces import TraceRequest, conversations
from gateway.replay.virtual_world import DEFAULT_OPTIONS, Flight, VirtualOptions, World


class OracleReplay(World):
    """A replay in which the oracle places every request (module docstring)."""

    def __init__(
        self,
        requests: Sequence[TraceRequest],
        configs: Mapping[str, SimConfig],
        options: VirtualOptions = DEFAULT_OPTIONS,
    ) -> None:
        super().__init__(requests, configs, options)
        self.horizons = horizons(self.requests)
        self.pricing = engines_of(configs)
        self.conversation = {i: n for n, group in enumerate(conversations(self.requests)) for i in group}
        self.slot_owner: dict[tuple[str, int], int] = {}

    def candidates(self, task: SimTask) -> list[Candidate]:
        """Every place ``task`` could go now, with its predicted TTFT (``backends.sim.whatif``)."""
        found: list[Candidate] = []
        for name, engine in self.engines.items():
            if isinstance(engine, LlamaEngine):
                options = whatif_slots(engine, task.prompt, task.user_start, task.first_user)
            else:
                assert isinstance(engine, VllmEngine)
                options = [whatif_vllm(engine, task.prompt, len(task.answer.tokens))]
            found += [Candidate(name, o.slot, o.ttft_s, o.cached_tokens) for o in options if o.fits]
        return found

    def pick(self, index: int, found: list[Candidate]) -> Candidate | None:
        """Where request ``index`` goes among ``found`` (the greedy oracle: the lowest score)."""
        places = owners(self.slot_owner, self.conversation, self.horizons, index)
        return choose(found, self.horizons[index], places, self.pricing)

    def send(self, index: int, request: TraceRequest, task: SimTask) -> None:
        found = self.candidates(task)
        pick = self.pick(index, found)
        if pick is None:
            self.fail(index, self.clock.now, "fits on no engine")
            return
        if pick.slot is not None:
            self.slot_owner[pick.backend, pick.slot] = index
        self.dispatch(Flight(index, self.clock.now, pick.backend, task), pick.slot)


TEMPERATURE = 0.25
"""How far a sampled schedule strays: a candidate 25% worse than the best is e^-1 as likely."""


class SampledOracleReplay(OracleReplay):
    """The oracle with its choices drawn instead of always the lowest score: each candidate with
    probability proportional to ``exp(-(score - best) / (temperature * best))`` (a random generator
    seeded with ``seed``). One draw is one hindsight schedule; the best of several and the greedy one
    (``simulate``'s ``schedules``) is a yardstick the greedy oracle cannot reach when a choice that
    looks worse now pays off later (a slot kept free, a queue left short)."""

    def __init__(
        self,
        requests: Sequence[TraceRequest],
        configs: Mapping[str, SimConfig],
        options: VirtualOptions = DEFAULT_OPTIONS,
        *,
        seed: int,
        temperature: float = TEMPERATURE,
    ) -> None:
        super().__init__(requests, configs, options)
        self.random = random.Random(seed)
        self.temperature = temperature

    def pick(self, index: int, found: list[Candidate]) -> Candidate | None:
        if not found:
            return None
        places = owners(self.slot_owner, self.conversation, self.horizons, index)
        values = scores(found, self.horizons[index], places, self.pricing)
        best = min(values)
        if not math.isfinite(best):  # nothing to weigh: the greedy choice
            return choose(found, self.horizons[index], places, self.pricing)
        scale = self.temperature * max(best, 1e-9)
        weights = [math.exp(-(v - best) / scale) for v in values]
        return self.random.choices(found, weights=weights)[0]
