"""The look-ahead oracle in virtual time: the greedy oracle's best candidates, each tried on a copy of
the world played to the end of the trace, the request placed where the trace's TTFT total is least.

At each request's send the greedy oracle (``virtual_oracle.OracleReplay``) scores every candidate
(each engine without slots, every llama.cpp slot). The ``width`` best of them are each tried: the
whole world (engines, queues, slots, the clients' pacing) is copied, the request placed on the
candidate, and the copy runs to the end of the trace with every later request placed by the greedy
oracle. A candidate's cost is the sum of the TTFTs still to come (this request's, those waiting for
their first token, every request not sent yet); a request that fails costs ``FAILED_S``. The request
goes to the cheapest candidate, the greedy one on a tie.

This is a rollout: one step of policy improvement over the greedy oracle. The greedy candidate is
always tried and the copies are exact (a copy played on decides and measures what the world itself
would: ``tests/replay/test_lookahead.py``), so each decision can only lower the total the greedy
continuation would reach, and the whole schedule's mean TTFT is at most the greedy oracle's. It
knows the future as the oracle does (every arrival, prompt and answer length) and plays it out with
the engines' own queueing instead of the oracle's ``future`` estimate. It is a yardstick found by
search, not a bound: a better schedule may exist. A bounded look-ahead (judging a candidate on the
next few requests only) was tried and is not one: on contention-4 it did worse than the greedy
oracle it starts from, since an agent's next turn often falls outside the window.

Its cost is ``width`` copies played to the end per request: quadratic in the trace's length (a
53-request contention-4 draw takes about 25 s against the oracle's 0.2 s), so ``bench/lookahead.py``
runs it on a few draws of the shorter rows.
"""

from __future__ import annotations

import copy
from collections.abc import Mapping, Sequence

from backends.sim import SimConfig
from gateway.replay.oracle import Candidate, owners, scores
from gateway.replay.results import Result
from gateway.replay.traces import TraceRequest
from gateway.replay.virtual_oracle import OracleReplay
from gateway.replay.virtual_world import DEFAULT_OPTIONS, Flight, VirtualOptions

WIDTH = 3
"""Candidates tried per request: the greedy oracle's best ``WIDTH`` by score."""
FAILED_S = 3600.0
"""What a request that fails costs a candidate (seconds of TTFT)."""


class LookaheadOracleReplay(OracleReplay):
    """A replay in which the look-ahead oracle places every request (module docstring)."""

    def __init__(
        self,
        requests: Sequence[TraceRequest],
        configs: Mapping[str, SimConfig],
        options: VirtualOptions = DEFAULT_OPTIONS,
        *,
        width: int = WIDTH,
    ) -> None:
        if width < 1:
            raise ValueError(f"width must be at least 1, not {width}")
        super().__init__(requests, configs, options)
        self.width = width
        self.rollouts = 0
        """Copies played to the end so far."""
        self._rolling = False  # a copy: every choice greedy after the first
        self._forced: Candidate | None = None  # a copy's first choice
        self._to_come = 0.0  # TTFTs since the world began, or since a copy was made
        self._greedy_total: float | None = None  # what the last choice's rollout added up to

    def pick(self, index: int, found: list[Candidate]) -> Candidate | None:
        if self._forced is not None:
            forced, self._forced = self._forced, None
            return forced
        if self._rolling or len(found) < 2:
            return super().pick(index, found)
        places = owners(self.slot_owner, self.conversation, self.horizons, index)
        values = scores(found, self.horizons[index], places, self.pricing)
        ranked = sorted(range(len(found)), key=lambda k: values[k])[: self.width]
        best, best_cost = found[ranked[0]], float("inf")
        for k in ranked:
            if k == ranked[0] and self._greedy_total is not None:
                # the last choice's rollout went on greedily from there: this is its continuation
                cost = self._greedy_total - self._to_come
            else:
                cost = self._rollout(index, found[k])
            if cost < best_cost:
                best, best_cost = found[k], cost
        self._greedy_total = self._to_come + best_cost
        return best

    def _rollout(self, index: int, candidate: Candidate) -> float:
        """The TTFTs still to come with request ``index`` on ``candidate`` (module docstring)."""
        shared = (self.requests, self.horizons, self.conversation, self.pricing)
        clone = copy.deepcopy(self, {id(value): value for value in shared})
        clone._rolling, clone._forced, clone._to_come = True, candidate, 0.0
        clone._greedy_total = None
        clone._send(index)
        clone.events.run()
        self.rollouts += 1
        return clone._to_come

    # --- what a copy adds up ---------------------------------------------------------------------------

    def first_token(self, flight: Flight) -> None:
        self._to_come += self.clock.now - flight.sent

    def finish(self, result: Result) -> None:
        if not result.ok:
            self._to_come += FAILED_S
        super().finish(result)
