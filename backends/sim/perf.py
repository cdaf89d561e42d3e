"""The performance model both simulated engines run on (pure arithmetic, seconds before time scaling).

* prefill of ``n`` uncached prompt tokens takes ``n / prefill_tok_s``;
* one decode step producing one token for each of ``n`` running sequences takes
  ``(1 / decode_tok_s) * (1 + batch_slowdown * (n - 1))``;
* an engine step that does both takes the sum; every duration is multiplied by ``time_scale``.
"""

from __future__ import annotations

from dataclasses import dataclass

from backends.sim.config import SimConfig


@dataclass(frozen=True, slots=True)
class PerfModel:
    """Speeds of one simulated engine."""

    prefill_tok_s: float
    decode_tok_s: float
    batch_slowdown: float
    time_scale: float

    @classmethod
    def from_config(cls, config: SimConfig) -> PerfModel:
        """The model a :class:`SimConfig` describes."""
        return cls(config.prefill_tok_s, config.decode_tok_s, config.batch_slowdown, config.time_scale)

    def prefill_seconds(self, n_tokens: int) -> float:
        """Simulated seconds to prefill ``n_tokens`` uncached tokens: ``n / prefill_tok_s``."""
        return n_tokens / self.prefill_tok_s

    def decode_step_seconds(self, n_running: int) -> float:
        """Simulated seconds of one decode step: ``(1/decode_tok_s) * (1 + slowdown * (n_running - 1))``."""
        if n_running <= 0:
            return 0.0
        return (1.0 / self.decode_tok_s) * (1.0 + self.batch_slowdown * (n_running - 1))

    def step_seconds(self, prefill_tokens: int, n_decoding: int) -> float:
        """Wall seconds of one engine step (prefill part + decode part, times ``time_scale``)."""
        return (self.prefill_seconds(prefill_tokens) + self.decode_step_seconds(n_decoding)) * self.time_scale
