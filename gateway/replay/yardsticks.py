"""What a replay's numbers are measured against, from the trace alone: how much of each prompt is new,
and a lower bound on TTFT that no routing can beat.

**Shared prefix.** A request's prompt shares with the trace before it the longest run of leading
blocks (``hash_ids``) that an earlier prompt also began with, in tokens: whole blocks, and within the
last one as far as both prompts reach (a cut block is a prefix of the whole one). Its **new tokens**
are the rest; with the chat template around each prompt (its head once, its tail with every prompt
that has new tokens) their sum is the distinct tokens the engines saw, so ``prefill amplification``
= tokens the engines prefilled / distinct tokens (1.0: nothing was prefilled twice).

**Lower bound.** Each request alone on its best engine with the most reuse it could have had:
``min over engines prefill_seconds(P - reuse, reuse)`` (the engine's profile: ``(P - reuse) / prefill
rate`` for a linear one), plus the gateway's own time, where ``P`` is the
prompt the engine sees (chat template included) and ``reuse`` its whole shared prefix on llama.cpp
(an upper bound: every earlier prompt kept in some slot or in RAM, checkpoints anywhere; all of ``P``
when an earlier prompt had all of this one), the shared
prefix cut to whole cache blocks on vLLM with prefix caching, nothing on vLLM without it; at least
one token is always computed. The first token comes with the last prompt step, so nothing else is
added. An engine whose window the prompt does not fit is not a candidate.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence

from backends.sim import SimConfig
from backends.sim.config import DENSE_BLOCK_SIZE
from gateway.replay.synth import CHAT_HEAD, CHAT_TAIL, template_tokens, threaded
from gateway.replay.traces import BLOCK_TOKENS, TraceRequest
from policies.types import Architecture

TEMPLATE_TOKENS = len(CHAT_HEAD) + len(CHAT_TAIL)
"""Tokens the simulators' chat template adds around one user message."""


def shared_prefixes(requests: Sequence[TraceRequest], block: int = BLOCK_TOKENS) -> list[int]:
    """Per request, the tokens of its prompt that an earlier prompt began with too (module docstring)."""
    covered: dict[int, int] = {}  # chained hash of the first k ids -> most tokens of them a prompt had
    out: list[int] = []
    for request in requests:
        chain, parent = [], 0
        for block_id in request.hash_ids:
            parent = hash((parent, block_id))
            chain.append(parent)
        shared = 0
        for k, key in enumerate(chain, 1):
            had = covered.get(key)
            if had is None:
                break
            shared = min(had, request.input_tokens)
            if had < k * block:  # the earlier prompt ended inside this block
                break
        out.append(shared)
        for k, key in enumerate(chain, 1):
            covered[key] = max(covered.get(key, 0), min(k * block, request.input_tokens))
    return out


def new_tokens(requests: Sequence[TraceRequest], block: int = BLOCK_TOKENS) -> list[int]:
    """Per request, its prompt tokens no earlier prompt began with."""
    shared = shared_prefixes(requests, block)
    return [r.input_tokens - s for r, s in zip(requests, shared, strict=True)]


def distinct_tokens(new: Sequence[int]) -> int:
    """The distinct tokens the engines saw of prompts with these new tokens (module docstring)."""
    return len(CHAT_HEAD) + sum(n + len(CHAT_TAIL) for n in new if n > 0)


def _reuse(config: SimConfig, shared: int) -> int:
    if config.kind == "llamacpp":
        return shared
    if not config.prefix_caching:
        return 0
    size = config.block_size if config.architecture is Architecture.HYBRID else DENSE_BLOCK_SIZE
    return shared // size * size


def lower_bounds(
    requests: Sequence[TraceRequest],
    configs: Mapping[str, SimConfig],
    overhead_s: float,
    block: int = BLOCK_TOKENS,
) -> list[float | None]:
    """Per request, the TTFT lower bound of the module docstring (None: it fits no engine)."""
    out: list[float | None] = []
    for request, shared in zip(threaded(requests, block), shared_prefixes(requests, block), strict=True):
        template = template_tokens(request)
        prompt = request.input_tokens + template
        best = math.inf
        # the whole prompt, template and all, when an earlier one was all of it (an exact repeat, or
        # one that went on: counting the template's tail as shared keeps this a lower bound); else
        # the shared text and the template before the last message's text (of a conversation's
        # later turn, the template after the shared text too: still a lower bound)
        known = prompt if shared == request.input_tokens else shared + template - len(CHAT_TAIL)
        for config in configs.values():
            if prompt > config.context_window or (config.kind == "vllm" and prompt >= config.context_window):
                continue
            reuse = min(_reuse(config, known), prompt - 1)
            best = min(best, config.engine_profile.prefill_seconds(prompt - reuse, reuse))
        out.append(None if math.isinf(best) else best + overhead_s)
    return out
