"""The performance model both simulated engines run on: an engine profile, in simulated seconds.

The profile (``policies.engine_profile``) prices each engine step: its prompt chunks (micro-batches
with their fixed cost, tokens and attention, llama-server's checkpoint cuts) and its decode step
(sequences and context). ``time_scale`` turns simulated seconds into wall seconds for the HTTP
simulators; the virtual replay uses simulated seconds as they are.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from backends.sim.config import SimConfig
from policies.engine_profile import EngineProfile


@dataclass(frozen=True, slots=True)
class PerfModel:
    """The speeds of one simulated engine: its profile and the wall clock's scale."""

    profile: EngineProfile
    time_scale: float

    @classmethod
    def from_config(cls, config: SimConfig) -> PerfModel:
        """The model a :class:`SimConfig` describes."""
        return cls(config.engine_profile, config.time_scale)

    def prefill_seconds(
        self,
        new: int,
        cached: int = 0,
        user_start: int = -1,
        *,
        first_user: int = -1,
        checkpoints: bool = True,
    ) -> float:
        """Simulated seconds to prefill ``new`` tokens after ``cached`` reused ones, alone (llama.cpp,
        hybrid: with the context checkpoints it takes, ``user_start`` one of them; ``checkpoints=False``
        for the rest of a prompt already launched: the engine charged them then)."""
        return self.profile.prefill_seconds(
            new, cached, user_start, first_user=first_user, checkpoints=checkpoints
        )

    def decode_step_seconds(self, n_running: int, context: int = 0) -> float:
        """Simulated seconds of one decode step for ``n_running`` sequences of ``context`` tokens in all."""
        return self.profile.decode_step_seconds(n_running, context)

    def step_seconds(
        self, chunks: Sequence[tuple[int, int, bool]], n_decoding: int, context: int = 0
    ) -> float:
        """Simulated seconds of one engine step: prompt ``chunks`` (tokens, context before them, whether
        it is its request's first) and a decode step for ``n_decoding`` sequences of ``context`` tokens."""
        prefill = sum(self.profile.chunk_seconds(n, before, first=first) for n, before, first in chunks)
        return prefill + self.profile.decode_step_seconds(n_decoding, context)
