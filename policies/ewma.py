"""A learned value: an exponentially weighted mean of samples, bounded from its prior.

Three kinds (``policies.learning`` says which value is which):

- a plain mean (``update``): the first sample replaces the prior, later ones move it by ``ALPHA``;
  clamped to ``[prior / SPREAD, prior * SPREAD]`` (a ratio: ``[0, RATIO_MAX]``);
- a multiplicative factor (``update_factor``): averaged in log space from its prior;
- an engine **rate** (``rate=True``: prefill and decode tokens a second), robust to one bad sample
  (issue #59: one streamed ``/v1/responses`` request whose envelope event was taken for its first
  token taught a vLLM prefill rate of 202,525 tok/s where it had learned 6,464, and the next turn of
  a session warm on llama.cpp went to vLLM):

  * **one observation moves a rate at most ``MAX_STEP`` (2x)** either way, the first one included;
  * a sample more than ``FAR`` (4x) **faster** than the learned rate is **set aside** (counted in
    ``aside``; the last one kept in ``last_aside`` with the rate it was compared with,
    ``last_against``, for the dashboard; ``held`` while the next sample may confirm it), unless the
    sample before it was set aside (or believed the same way) and lies within ``AGREE`` (2x) of it:
    an engine that really is that much faster than its profile (a profile from a slower machine, a
    compressed clock) says so twice in a row and is then learned, at most 2x a sample; one odd
    measurement is never learned at all;
  * a **slow** sample is learned, 2x at most: an engine is slower than its profile whenever it is
    busy (a prefill that shared its steps with other requests' is a real, slower prefill), and
    setting such samples aside cost 2% of mean TTFT on the validation set's ``val-copilot-burst``
    (where a slow vLLM prefill marks a busy vLLM). An engine never runs 4x faster than it has been:
    such a sample is an error of measurement (an envelope event taken for a token).
"""

from __future__ import annotations

import math

import msgspec
from msgspec.structs import replace

ALPHA = 0.3
SPREAD = 100.0
"""How far a learned value may move from its prior, either way: 100x covers a 500-token turn that paid a
6-second batch on an engine whose prior is the seeds' 3000 tok/s (48 tok/s on the H200 run, DOMAIN.md)."""
RATIO_MAX = 1.5
MAX_STEP = 2.0
"""The most one observation moves a learned rate, either way."""
FAR = 4.0
"""A rate sample this many times faster than the learned rate, alone, is set aside."""
AGREE = 2.0
"""Two set-aside samples in a row within this factor of each other are believed."""


def _off(a: float, b: float) -> float:
    """How many times ``a`` and ``b`` differ (>= 1); infinite when either is not positive."""
    if a <= 0 or b <= 0:
        return math.inf
    return max(a / b, b / a)


class Ewma(msgspec.Struct, frozen=True):
    value: float
    prior: float
    samples: int = 0
    ratio: bool = False  # a fraction (reuse): clamped to [0, RATIO_MAX] instead of the prior's spread
    rate: bool = False  # an engine rate: robust to one bad sample (module docstring)
    aside: int = 0
    """Samples set aside (rates only): each more than ``FAR`` times faster than the learned rate, alone."""
    held: float = 0.0
    """The far sample the next one may agree with (0: none): the last set aside or believed."""
    last_aside: float = 0.0
    """The last sample set aside, as measured (before the clamp; 0: none yet), shown on the dashboard."""
    last_against: float = 0.0
    """The learned rate ``last_aside`` was compared with."""

    def update(self, sample: float) -> Ewma:
        if not math.isfinite(sample):
            return self
        if self.ratio or self.prior <= 0:
            low, high = 0.0, RATIO_MAX
        else:
            low, high = self.prior / SPREAD, self.prior * SPREAD
        raw, sample = sample, min(max(sample, low), high)
        if not self.rate:
            value = sample if self.samples == 0 else self.value + ALPHA * (sample - self.value)
            return replace(self, value=value, samples=self.samples + 1)
        far = sample > self.value * FAR  # faster than the engine has been: a measurement error
        if far and not (self.held and _off(sample, self.held) <= AGREE):
            return replace(self, aside=self.aside + 1, held=sample, last_aside=raw, last_against=self.value)
        value = sample if self.samples == 0 else self.value + ALPHA * (sample - self.value)
        value = min(max(value, self.value / MAX_STEP), self.value * MAX_STEP)
        # a far sample believed keeps the streak open: the next far one that agrees is learned too
        return replace(self, value=value, samples=self.samples + 1, held=sample if far else 0.0)

    def update_factor(self, sample: float, spread: float) -> Ewma:
        """For a multiplicative factor (``queue_factor``): ``sample`` clamped to ``[1/spread,
        spread]`` of the prior and averaged in log space, starting from the prior. The first
        sample does not replace the prior: one sample is one sample."""
        if not math.isfinite(sample) or self.value <= 0:
            return self
        sample = min(max(sample, self.prior / spread), self.prior * spread)  # a first token before
        # the predicted prefill (below 0) counts as the floor: the queue model over-predicted
        value = math.exp(math.log(self.value) + ALPHA * (math.log(sample) - math.log(self.value)))
        return replace(self, value=value, samples=self.samples + 1)
