"""Simulator-only ``POST /_sim/whatif``: what a request WOULD get from this engine now, without sending it.

No real engine has this endpoint; it exists so the routing benchmark can compute a hindsight oracle
from the simulator's true state. It is pure over the engine state: nothing is queued, no cache entry is
touched (the vLLM block cache is read without refreshing its LRU order), no counter moves.

The body is a chat (``messages``) or completion (``prompt``) request as the engine would receive it.
The answer is one JSON object::

    {"fits": bool, "prompt_tokens": P, "cached_tokens": C, "slot": s | null,
     "queue_s": q, "prefill_s": p, "ttft_s": q + p + d}

llama.cpp without ``id_slot`` also gives ``"options"``: that object for every slot (the top level is
the best of them). Times are simulated seconds (``time_scale`` does not apply); with ``rate`` the
prefill rate, ``step(n)`` the decode step of ``n`` sequences and ``chunk`` the prefill tokens per engine step:

* **vLLM** (continuous batching; no admission limit is reached in practice): the new prompt's uncached
  tokens are prefilled after every token still to prefill ahead of it (``A``: the running requests'
  ``prefill_left`` plus the waiting requests' uncached prompts), ``ceil((A + P - C) / chunk)`` steps
  that also decode the ``n`` requests already running or waiting::

      q = A / rate,  p = (P - C) / rate,  d = ceil((A + P - C) / chunk) * step(n)

  ``C``: the leading stored blocks (``BlockCache`` rule; 0 with prefix caching off).
* **llama.cpp** (per slot ``s``; with ``id_slot`` only that slot, else every slot and the one with the
  lowest ``ttft_s`` wins, ties to the lower id): the work ahead on ``s`` is its running task's rest
  (``prefill_left / rate + tokens_left * step(1)``) plus every deferred task pinned to ``s``
  (``(P_t - C_t) / rate + n_t * step(1)``). The slot's tokens and checkpoints are rolled forward
  through that work with ``prefix_cache.llama_reuse`` / ``add_checkpoints`` and the end-of-task rule
  (prompt + generated tokens minus the last one), then ``C = llama_reuse(...).n_past`` for this
  prompt; on an idle slot whose pinning would consult the RAM prompt cache, from the cached state
  that would be loaded (``ram_cache.RamCache.best``). When the slot is idle now, the other slots'
  running prompts are prefilled in the same steps::

      q = work ahead,  p = (P - C) / rate,
      d = 0 if q > 0 else  A / rate + ceil((A + P - C) / chunk) * step(n)   (A, n: the other slots)

  A prompt longer than the slot's ``n_ctx`` does not fit (``fits`` false, ``ttft_s`` infinite -> null).

On vLLM a request fits when its prompt is shorter than ``max_model_len`` and ``max_tokens`` is at most
that: a longer answer is clamped, not refused (``vllm_errors.context_error``).
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import asdict, dataclass
from typing import Any

import msgspec
from litestar import Request, Response, post

from backends.sim.chat import InvalidChat
from backends.sim.engine_base import BatchEngine
from backends.sim.http_common import json_response, read_json
from backends.sim.llama_engine import LlamaEngine
from backends.sim.llama_slots import Slot, select_slot
from backends.sim.prefix_cache import BlockCache, add_checkpoints, block_hashes, llama_reuse
from backends.sim.requests import Endpoint, parse_request
from backends.sim.task import SimTask
from backends.sim.vllm_engine import VllmEngine


@dataclass(frozen=True, slots=True)
class WhatIf:
    """The predicted outcome of one request on one engine (simulated seconds)."""

    fits: bool
    prompt_tokens: int
    cached_tokens: int
    slot: int | None
    queue_s: float
    prefill_s: float
    ttft_s: float

    def to_json(self) -> dict[str, Any]:
        """A JSON-ready dict; an infinite ``ttft_s`` becomes null."""
        out = asdict(self)
        if not math.isfinite(self.ttft_s):
            out["ttft_s"] = None
        return out


def peek_block_hits(cache: BlockCache, prompt: Sequence[int]) -> int:
    """``BlockCache.hits`` without refreshing the LRU order (the cache is only read)."""
    if not prompt:
        return 0
    limit = (len(prompt) - 1) // cache.block
    found = 0
    stored = cache._blocks  # read-only access to the cache's set of block hashes
    for h in block_hashes(prompt[: limit * cache.block], cache.block):
        if h not in stored:
            break
        found += 1
    return found * cache.block


def _steps(tokens: int, chunk: int) -> int:
    return math.ceil(tokens / chunk) if tokens > 0 else 0


def whatif_vllm(engine: VllmEngine, prompt: Sequence[int], max_tokens: int | None) -> WhatIf:
    """The vLLM prediction (formula in the module docstring)."""
    perf, config = engine.perf, engine.config
    window = config.context_window  # vLLM refuses a prompt of the whole window; a long answer is clamped
    fits = len(prompt) < window and (max_tokens or 1) <= window
    cache = engine.cache
    cached = peek_block_hits(cache, prompt) if cache is not None else 0
    ahead = sum(t.prefill_left for t in engine.running)
    ahead += sum(len(t.prompt) - (peek_block_hits(cache, t.prompt) if cache else 0) for t in engine.waiting)
    own = len(prompt) - cached
    n_others = len(engine.running) + len(engine.waiting)
    queue_s = perf.prefill_seconds(ahead)
    prefill_s = perf.prefill_seconds(own, cached)
    decode_s = _steps(ahead + own, config.prefill_chunk) * perf.decode_step_seconds(n_others)
    ttft = queue_s + prefill_s + decode_s if fits else math.inf
    return WhatIf(fits, len(prompt), cached, None, queue_s, prefill_s, ttft)


def _end_tokens(task: SimTask) -> list[int]:
    """A slot's tokens after ``task`` finishes: prompt + generated ids except the last sampled one."""
    return list(task.prompt) + [t.id for t in task.answer.tokens][:-1]


def _slot_whatif(
    engine: LlamaEngine, slot: Slot, prompt: Sequence[int], user_start: int = -1, first_user: int = -1
) -> WhatIf:
    perf, hybrid = engine.perf, engine.hybrid
    tokens, checkpoints = list(slot.tokens), slot.checkpoints
    wait = 0.0
    current = slot.task
    if current is not None:
        left, done = current.prefill_left, len(current.prompt) - current.prefill_left
        wait += perf.prefill_seconds(left, done, checkpoints=False)  # its checkpoints: charged at launch
        wait += (len(current.answer.tokens) - current.n_emitted) * perf.decode_step_seconds(1)
        tokens = _end_tokens(current)
    for task in engine.deferred:
        if task.id_slot == -1 or task.id_slot % len(engine.slots) != slot.id:
            continue
        reuse = llama_reuse(tokens, checkpoints, task.prompt, hybrid=hybrid, cache_prompt=task.cache_prompt)
        kept, prompt_len, user, first = reuse.checkpoints, len(task.prompt), task.user_start, task.first_user
        wait += perf.prefill_seconds(prompt_len - reuse.n_past, reuse.n_past, user, first_user=first)
        wait += len(task.answer.tokens) * perf.decode_step_seconds(1)
        gap = engine.checkpoint_gap
        checkpoints = add_checkpoints(kept, prompt_len, reuse.n_past, gap, user, first) if hybrid else ()
        tokens = _end_tokens(task)
    if current is None and engine.ram_cache is not None:
        probe = Slot(slot.id, slot.n_ctx, tokens=tokens, checkpoints=checkpoints)
        if select_slot([probe], prompt, 0).update_cache:
            entry = engine.ram_cache.best(tokens, prompt)
            if entry is not None:
                tokens, checkpoints = entry.tokens, entry.checkpoints
    reuse = llama_reuse(tokens, checkpoints, prompt, hybrid=hybrid)
    own = len(prompt) - reuse.n_past
    prefill_s = perf.prefill_seconds(own, reuse.n_past, user_start, first_user=first_user)
    if reuse.restores:  # a checkpoint back on the GPU, in prompt_ms
        prefill_s += perf.profile.cache.checkpoint_restore_s
    decode_s = 0.0
    if current is None:
        others = [s.task for s in engine.slots if s.task is not None]
        ahead = sum(t.prefill_left for t in others)
        wait = perf.prefill_seconds(ahead, checkpoints=False)  # launched: their checkpoints are charged
        decode_s = _steps(ahead + own, engine.config.prefill_chunk) * perf.decode_step_seconds(len(others))
    fits = len(prompt) <= slot.n_ctx
    ttft = wait + prefill_s + decode_s if fits else math.inf
    return WhatIf(fits, len(prompt), reuse.n_past, slot.id, wait, prefill_s, ttft)


def whatif_slots(
    engine: LlamaEngine, prompt: Sequence[int], user_start: int = -1, first_user: int = -1
) -> list[WhatIf]:
    """The llama.cpp prediction for every slot, by slot id (``user_start``: where the prompt's last
    user message starts, a checkpoint the engine takes)."""
    return [_slot_whatif(engine, slot, prompt, user_start, first_user) for slot in engine.slots]


def whatif_llama(
    engine: LlamaEngine, prompt: Sequence[int], id_slot: int = -1, user_start: int = -1, first_user: int = -1
) -> WhatIf:
    """The llama.cpp prediction for slot ``id_slot``, or for the best slot when it is -1."""
    if id_slot != -1:
        return _slot_whatif(engine, engine.slots[id_slot % len(engine.slots)], prompt, user_start, first_user)
    return min(whatif_slots(engine, prompt, user_start, first_user), key=lambda w: (w.ttft_s, w.slot or 0))


@post("/_sim/whatif", status_code=200)
async def sim_whatif(request: Request[Any, Any, Any]) -> Response[bytes]:
    """Simulator-only: the predicted cached tokens and TTFT of the request in the body (module docstring)."""
    engine: BatchEngine = request.app.state.sim
    try:
        body = await read_json(request)
        if not isinstance(body, dict):
            raise InvalidChat("request body must be a JSON object", "body")
        endpoint = Endpoint.CHAT if "messages" in body else Endpoint.COMPLETION
        req = parse_request(body, endpoint, llama=isinstance(engine, LlamaEngine))
    except (msgspec.DecodeError, InvalidChat) as exc:
        return json_response({"error": {"message": str(exc), "type": "invalid_request_error"}}, 400)
    if isinstance(engine, LlamaEngine):
        if req.id_slot == -1:
            options = whatif_slots(engine, req.prompt, req.user_start, req.first_user)
            best = min(options, key=lambda w: (w.ttft_s, w.slot or 0))
            return json_response({**best.to_json(), "options": [o.to_json() for o in options]})
        result = whatif_llama(engine, req.prompt, req.id_slot, req.user_start, req.first_user)
    else:
        assert isinstance(engine, VllmEngine)
        result = whatif_vllm(engine, req.prompt, req.max_tokens)
    return json_response(result.to_json())
