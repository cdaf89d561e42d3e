"""The published routers' rules, written as turnout scorers and pickers from their sources, so every
benchmark row can run them beside ``cost`` (the profiles: ``policies.profiles.PEER_PROFILES``).

Each reads only what its router reads in its own deployment: its own routing history (turnout's prefix
index of the prompts it sent: ``CandidateView.match``; its requests in flight, sends and latencies:
``CandidateView.router``), the engines' metrics it scrapes (the snapshot's queue and KV use), and the
request's headers. None reads turnout's engine models (the estimate), and none pins a llama.cpp slot:
no peer can see slots, so llama-server picks one by its own prompt similarity (``pins_slots=False``).
The nearest equivalents, where a peer's view differs from turnout's:

- a peer's approximate prefix tree of what it routed (characters or 16-token blocks) is turnout's
  prefix index of what it sent (1 KiB chunks, the same history): ``match.recent`` tokens;
- "ties at random" (llm-d, Dynamo, the production stack, LiteLLM) is a pseudo-random choice seeded
  by the request counter, so a replay stays deterministic.

Sources, read 2026-12 (the defaults below are theirs):

- **llm-d / Gateway API Inference Extension EPP**, default scheduling profile: llm-d/llm-d-inference-
  scheduler @520af47 (v0.8.0+), ``pkg/epp/config/loader/defaults.go``, the scorers under
  ``pkg/epp/framework/plugins/scheduling/``; the same weights in kubernetes-sigs/gateway-api-inference-
  extension v1.5.0. ``prefix-cache-scorer`` 3 (matched / total 16-token blocks of the first 256, from
  what it routed), ``queue-scorer`` 2 (min-max of the waiting queue), ``kv-cache-utilization-scorer``
  2 (1 - KV use), ``max-score-picker`` (ties shuffled).
- **SGLang router / SMG gateway**, ``cache_aware``: smg-project/smg @f8daa88 (v1.9.0+193),
  ``model_gateway/src/policies/cache_aware.rs``, CLI defaults ``cache_threshold`` 0.3,
  ``balance_abs_threshold`` 64, ``balance_rel_threshold`` 1.5. A prompt matched above the threshold
  goes to the least-loaded of the workers holding the deepest match (ties at random), unless that
  worker's load exceeds both 1.5x the mean and the mean + 64; else (a miss, or that gate) to the
  least-loaded worker (ties: the one sent fewer requests so far, then the first). Load: the router's
  own requests in flight.
- **NVIDIA Dynamo KV router**: ai-dynamo/dynamo @07a6c9c, ``lib/kv-router/src/scheduling/selector/
  default.rs``, ``KvRouterConfig::default`` (``prefill_load_scale`` 1, ``overlap_score_credit`` 1,
  temperature 0): cost = max(0, (active prefill tokens + ISL) / block - overlap blocks) + decode blocks
  (the blocks of its live requests and the new request's uncached ones), the least cost, ties at
  random. Block 16 tokens (vLLM's). Its overlap comes from KV events by default; llama-server
  publishes none, so this is its approximate mode (``use_kv_events=false``: what it routed).
- **vLLM production stack**: vllm-project/production-stack @a6c01db,
  ``src/vllm_router/routers/routing_logic.py``. ``session``: a consistent-hash ring (uhashring: 160
  points per endpoint, md5) of the session header (it reads one configured header; here any session
  key the client gave: a header, ``prompt_cache_key``, ``user``); without one, the endpoint with the
  fewest requests in the last minute (one with none first, in order). ``prefixaware``: the longest
  prefix match of what it routed (a hash trie of 128-character chunks), at random among the endpoints
  holding it; no match, at random among all.
- **LiteLLM**: BerriAI/litellm, ``litellm/router_strategy/least_busy.py`` @00e06b8 (the fewest
  requests in flight, the first in order on a tie) and ``lowest_latency.py`` @015b945 (the lowest mean
  of the recent seconds per output token; for a streamed request the sum of the recent TTFTs per output
  token divided by the number of latency samples, as its source computes it; a deployment never seen
  counts 0, so it is tried first; ties at random).
"""

from __future__ import annotations

import hashlib
import math
from bisect import bisect_right
from collections.abc import Callable, Sequence

from policies.decision import ScoredCandidate
from policies.types import Reason, RequestFeatures
from policies.views import CandidateView, Pick

EPP_BLOCK_TOKENS = 16
EPP_MAX_BLOCKS = 256
DYNAMO_BLOCK_TOKENS = 16
SGLANG_CACHE_THRESHOLD = 0.3
SGLANG_BALANCE_ABS = 64
SGLANG_BALANCE_REL = 1.5
RING_POINTS = 160
LITELLM_SAMPLES = 10


def pseudo_random(sequence: int, n: int) -> int:
    """An index in ``range(n)`` that looks random and is a function of the request counter."""
    return ((sequence * 2654435761 + 0x9E3779B9) & 0xFFFFFFFF) % n


def _recent(view: CandidateView) -> int:
    return view.match.recent if view.match is not None else 0


# --- scorers (features, candidates, sequence) -> one value each in [0, 1] ---------------------------


def epp_prefix(features: RequestFeatures, views: Sequence[CandidateView], sequence: int) -> list[float]:
    """llm-d's approximate prefix-cache scorer: the share of the prompt's first 256 blocks of 16 tokens
    that the backend holds, by what the router sent there."""
    total = min(math.ceil(features.prompt_tokens / EPP_BLOCK_TOKENS), EPP_MAX_BLOCKS)
    if total <= 0:
        return [0.0 for _ in views]
    return [min(_recent(v) // EPP_BLOCK_TOKENS, total) / total for v in views]


def epp_queue(features: RequestFeatures, views: Sequence[CandidateView], sequence: int) -> list[float]:
    """llm-d's queue scorer: the waiting queue, min-max normalised (1 for the shortest; all 1 if equal)."""
    queues = [v.snapshot.queued for v in views]
    low, high = min(queues), max(queues)
    return [1.0 if high == low else (high - q) / (high - low) for q in queues]


def epp_kv(features: RequestFeatures, views: Sequence[CandidateView], sequence: int) -> list[float]:
    """llm-d's KV-cache utilisation scorer: 1 - KV use (an engine that reports none reads as empty)."""
    return [1.0 - (v.snapshot.kv_usage or 0.0) for v in views]


def dynamo_cost(features: RequestFeatures, view: CandidateView) -> float:
    """Dynamo's cost of sending the request to ``view``, in blocks (lower is better)."""
    block, isl = DYNAMO_BLOCK_TOKENS, features.prompt_tokens
    overlap = _recent(view) // block
    prefill = max((view.router.prefill_tokens + isl) / block - overlap, 0.0)
    decode = view.router.open_tokens / block + max(math.ceil(isl / block) - overlap, 0)
    return prefill + decode


def dynamo(features: RequestFeatures, views: Sequence[CandidateView], sequence: int) -> list[float]:
    """Dynamo's cost as a score: 1 for the least, 0 for the most (all 1 if equal)."""
    costs = [dynamo_cost(features, v) for v in views]
    low, high = min(costs), max(costs)
    return [1.0 if high == low else (high - c) / (high - low) for c in costs]


def least_busy(features: RequestFeatures, views: Sequence[CandidateView], sequence: int) -> list[float]:
    """The router's own requests in flight: ``1 / (1 + n)``."""
    return [1.0 / (1.0 + v.router.in_flight) for v in views]


PEER_SCORERS: dict[str, Callable[[RequestFeatures, Sequence[CandidateView], int], list[float]]] = {
    "epp-prefix": epp_prefix,
    "epp-queue": epp_queue,
    "epp-kv": epp_kv,
    "dynamo-kv-cost": dynamo,
    "least-busy": least_busy,
}


# --- pickers (features, scored, views, sequence) -> (index, reason) ---------------------------------


def _at_random(indices: Sequence[int], sequence: int) -> int:
    return indices[pseudo_random(sequence, len(indices))] if len(indices) > 1 else indices[0]


def max_score(
    features: RequestFeatures,
    scored: Sequence[ScoredCandidate],
    views: Sequence[CandidateView],
    sequence: int,
) -> Pick:
    """The highest weighted score, ties at random (llm-d's max-score picker; Dynamo at temperature 0)."""
    best = max(c.score for c in scored)
    return _at_random(
        [i for i, c in enumerate(scored) if c.score >= best - 1e-12], sequence
    ), Reason.PEER_RULE


def _least_loaded(indices: Sequence[int], loads: Sequence[int], sent: Sequence[int]) -> int:
    """SMG's least-loaded worker: by load, then by requests sent there so far, then by order."""
    return min(indices, key=lambda i: (loads[i], sent[i], i))


def sglang_cache_aware(
    features: RequestFeatures,
    scored: Sequence[ScoredCandidate],
    views: Sequence[CandidateView],
    sequence: int,
) -> Pick:
    """SMG's cache-aware policy (module docstring)."""
    loads = [v.router.in_flight for v in views]
    everyone = range(len(views))
    least = _least_loaded(everyone, loads, [v.router.sent_total for v in views])
    prompt = max(features.prompt_tokens, 1)
    rates = [min(_recent(v), prompt) / prompt for v in views]
    deepest = max(rates)
    if deepest <= SGLANG_CACHE_THRESHOLD:
        return least, Reason.PEER_RULE
    holders = [i for i in everyone if rates[i] == deepest]
    fewest = min(loads[i] for i in holders)
    chosen = _at_random([i for i in holders if loads[i] == fewest], sequence)
    mean = sum(loads) / len(loads)
    if loads[chosen] > mean * SGLANG_BALANCE_REL and loads[chosen] > mean + SGLANG_BALANCE_ABS:
        return least, Reason.PEER_RULE
    return chosen, Reason.PEER_RULE


def _ring_point(text: str) -> int:
    return int(hashlib.md5(text.encode(), usedforsecurity=False).hexdigest(), 16)


def ring_owner(key: str, nodes: Sequence[str]) -> int:
    """The node of ``nodes`` a consistent-hash ring (160 md5 points a node, as uhashring) gives ``key``."""
    points = sorted(
        (_ring_point(f"{node}-{w}"), index) for index, node in enumerate(nodes) for w in range(RING_POINTS)
    )
    at = bisect_right([p for p, _ in points], _ring_point(key))
    return points[at % len(points)][1]


def vllm_session(
    features: RequestFeatures,
    scored: Sequence[ScoredCandidate],
    views: Sequence[CandidateView],
    sequence: int,
) -> Pick:
    """The production stack's ``session`` routing (module docstring)."""
    if features.session_key is not None and features.session_source.value != "implicit":
        return ring_owner(features.session_key, [v.snapshot.backend_id for v in views]), Reason.PEER_RULE
    sent = [v.router.sent_last_minute for v in views]
    return min(range(len(views)), key=lambda i: (sent[i], i)), Reason.PEER_RULE


def vllm_prefix(
    features: RequestFeatures,
    scored: Sequence[ScoredCandidate],
    views: Sequence[CandidateView],
    sequence: int,
) -> Pick:
    """The production stack's ``prefixaware`` routing (module docstring)."""
    held = [_recent(v) for v in views]
    longest = max(held)
    candidates = [i for i, h in enumerate(held) if h == longest] if longest > 0 else list(range(len(views)))
    return _at_random(candidates, sequence), Reason.PEER_RULE


def litellm_least_busy(
    features: RequestFeatures,
    scored: Sequence[ScoredCandidate],
    views: Sequence[CandidateView],
    sequence: int,
) -> Pick:
    """LiteLLM's ``least-busy``: the fewest requests in flight, the first in order on a tie."""
    return min(range(len(views)), key=lambda i: (views[i].router.in_flight, i)), Reason.PEER_RULE


def litellm_latency_of(view: CandidateView, stream: bool) -> float:
    """What LiteLLM's ``latency-based-routing`` compares for one deployment (module docstring)."""
    latencies = view.router.latency_per_token or (0.0,)
    if stream and view.router.ttft_per_token:
        return sum(view.router.ttft_per_token) / len(latencies)  # its source divides by the latencies' count
    return sum(latencies) / len(latencies)


def litellm_latency(
    features: RequestFeatures,
    scored: Sequence[ScoredCandidate],
    views: Sequence[CandidateView],
    sequence: int,
) -> Pick:
    """LiteLLM's ``latency-based-routing`` (buffer 0: the lowest, ties at random)."""
    values = [litellm_latency_of(v, features.stream) for v in views]
    lowest = min(values)
    return _at_random([i for i, x in enumerate(values) if x <= lowest], sequence), Reason.PEER_RULE


PEER_PICKERS: dict[
    str, Callable[[RequestFeatures, Sequence[ScoredCandidate], Sequence[CandidateView], int], Pick]
] = {
    "max-score-random": max_score,
    "sglang-cache-aware": sglang_cache_aware,
    "vllm-session": vllm_session,
    "vllm-prefixaware": vllm_prefix,
    "litellm-least-busy": litellm_least_busy,
    "litellm-latency": litellm_latency,
}


def litellm_samples(samples: tuple[float, ...], value: float) -> tuple[float, ...]:
    """LiteLLM's update of a deployment's latency list: the first nine kept, the last replaced."""
    return (*samples[: LITELLM_SAMPLES - 1], value)
