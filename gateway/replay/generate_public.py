"""The validation set's workloads (issue #59): traffic shaped after public traces, never tuned on.

The benchmark's rows (``gateway.replay.generate``) are what the routing rules were tuned looking at;
these are what a routing change is judged on before it lands (``bench/routing.py --validation``,
docs/validation.md). Their shapes come from public material that differs from the
rows: long agent sessions of many LLM calls a turn, and bursty one-off arrivals.

* **copilot** (GitHub's Copilot coding-agent traces, Azure/AzurePublicDataset,
  GitHubCopilotCodingAgentDataset2026.md and its dataset card, 2026-06-01..07: 301,026 sessions,
  1,189,581 user turns, 9,310,255 LLM calls, 631.4B prompt tokens of which 541.0B cached, 4.91B
  completion tokens). Published as text: **3.95 user turns a session and 7.83 LLM calls a turn**
  on average; from the totals, **~67.8k prompt tokens a call, 85.7% cached, ~528 completion tokens**.
  Not published as numbers (figures only): the distributions, the tool and user gaps, arrivals.
  So: user turns ``1 + Geometric`` of mean 3.95, LLM calls a turn ``1 + Geometric`` of mean 7.83;
  each call adds its answer and ``TOOL_TOKENS`` of tool output, so that ~86% of a call's prompt was
  sent before (``1 - NEW_SHARE``); a session starts from its harness's system prompt and
  tools (shared by every session) plus its task; when its context passes ``COMPACT_AT`` of the
  fleet's window the agent compacts it (the trace's compaction events: a prompt drop of over 30%) to
  the system prompt and a summary. Prompts are **shorter than the traces'** (a mean of ~29k tokens
  against 67.8k): the workstation's llama.cpp slots hold 64k tokens, and the traces' mean call would
  not fit most of them; the shape (calls, growth, cached share) is kept. Answers: lognormal with
  mean 528 tokens (sigma 0.8), at most 4,096. Gaps (assumed, not published): a tool batch of
  lognormal median 2 s between calls (plus the answer's own time at ~50 tok/s: the runner also
  waits for the previous call to end); a user's 20-90 s between turns. Sessions start by the
  bursty arrivals below.
* **burst** (BurstGPT, HPMLL/BurstGPT: ChatGPT and GPT-4 traffic, 5.29M requests; the repository's
  scaling model draws request gaps from a Gamma distribution and lengths from a Zipf, its demo's
  defaults ``gamma_shape = 0.25``, ``zipf_param = 1.1``; its Figure 4: the median answer grows from
  ~100-150 tokens at 300 prompt tokens to ~400-450 at 2,000). One-off requests with Gamma(0.25)
  gaps (bursts: a coefficient of variation of 2, against a Poisson's 1), prompts Zipf(1.1) from 64
  tokens, at most 12k, answers ``100 + 0.17 * prompt`` tokens times a lognormal (sigma 0.5).
"""

from __future__ import annotations

import math
import random

from gateway.replay.generate import _blocks, _Ids, _one_off, _turn
from gateway.replay.traces import TraceRequest

TURNS_MEAN = 3.95
CALLS_MEAN = 7.83
PROMPT_MEAN = 67_818
NEW_SHARE = 1 - 540_950_119_440 / 631_401_670_144
"""The share of a call's prompt not cached: 14.3%."""
COMPLETION_MEAN = 528.0
HARNESS_TOKENS = 6_000
"""The harness's system prompt and tool definitions, shared by every session (scaled)."""
TOOL_TOKENS = 2_200
"""What a call adds besides its answer (tool output; on average, ``U(0.5, 1.5)`` of it): the growth
per call is not published, so it is set for the calls to resend ~86% of their prompt, the traces'
cached share, counting first calls and compactions (``tests/replay/test_generate_public.py``)."""
COMPACT_AT = 0.85
WINDOW = 64_000
BURST_SHAPE = 0.25
ZIPF = 1.1


def _geometric_from_one(rng: random.Random, mean: float) -> int:
    """1 + a geometric count: mean ``mean``."""
    p = 1 / mean
    return 1 + int(math.log(1 - rng.random()) / math.log(1 - p))


def _answer(rng: random.Random) -> int:
    sigma = 0.8
    return min(4096, max(1, round(rng.lognormvariate(math.log(COMPLETION_MEAN) - sigma**2 / 2, sigma))))


def _gamma_gaps(rng: random.Random, rate: float, n: int) -> list[float]:
    """``n`` arrival times with Gamma(``BURST_SHAPE``) gaps of mean ``1 / rate``."""
    t, out = 0.0, []
    for _ in range(n):
        t += rng.gammavariate(BURST_SHAPE, 1 / (rate * BURST_SHAPE))
        out.append(t)
    return out


def copilot_trace(
    *, sessions: int = 3, seed: int = 0, model: str = "replay", per_hour: float = 30.0
) -> list[TraceRequest]:
    """``sessions`` Copilot-shaped agent sessions (module docstring), starting by bursty arrivals."""
    rng = random.Random(f"copilot-{seed}")
    ids = _Ids.fresh(_blocks(HARNESS_TOKENS))
    harness = list(range(_blocks(HARNESS_TOKENS)))
    out: list[TraceRequest] = []
    for index, start in enumerate(_gamma_gaps(rng, per_hour / 3600, sessions)):
        name = f"copilot-{seed}-{index}"
        stream, size, t = list(harness), HARNESS_TOKENS + rng.randint(500, 3000), start
        for _ in range(_geometric_from_one(rng, TURNS_MEAN)):
            size += rng.randint(200, 1500)  # the user's message
            for _ in range(_geometric_from_one(rng, CALLS_MEAN)):
                if size > COMPACT_AT * WINDOW:  # compaction: the harness and a summary
                    stream = list(harness)
                    size = HARNESS_TOKENS + rng.randint(2000, 6000)
                answer = _answer(rng)
                out.append(_turn(stream, ids, t, name, model, size, answer))
                size += answer + round(TOOL_TOKENS * rng.uniform(0.5, 1.5))  # its answer, the tools' output
                t += answer / 50 + rng.lognormvariate(math.log(2.0), 0.8)
            t += rng.uniform(20.0, 90.0)
    return sorted(out, key=lambda r: r.t)


def burst_trace(
    *,
    requests: int = 120,
    seed: int = 0,
    model: str = "replay",
    per_s: float = 1.0,
    first_id: int = 0,
    min_tokens: int = 64,
) -> list[TraceRequest]:
    """``requests`` BurstGPT-shaped one-off requests (module docstring); block ids from ``first_id``
    (another trace merged with this one must not share them)."""
    rng = random.Random(f"burst-{seed}")
    ids = _Ids.fresh(first_id)
    out = []
    for t in _gamma_gaps(rng, per_s, requests):
        size = min(12_000, round(min_tokens * rng.paretovariate(ZIPF)))
        answer = min(2048, max(1, round((100 + 0.17 * size) * rng.lognormvariate(-0.125, 0.5))))
        out.append(_one_off(ids, t, model, size, answer))
    return out


def copilot_burst_trace(*, seed: int = 0, model: str = "replay") -> list[TraceRequest]:
    """Copilot sessions with BurstGPT one-offs over their span."""
    agents = copilot_trace(sessions=2, seed=seed, model=model, per_hour=60.0)
    span = max(r.t for r in agents)
    chat = burst_trace(requests=max(1, round(span / 4)), seed=seed, model=model, per_s=0.25, first_id=1 << 40)
    return sorted([*agents, *(r for r in chat if r.t <= span)], key=lambda r: r.t)
