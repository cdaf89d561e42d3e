"""The simulated vLLM's sleep mode (``--enable-sleep-mode`` with ``VLLM_SERVER_DEV_MODE=1``):
``POST /sleep?level=1|2``, ``POST /wake_up[?tags=weights|kv_cache]``, ``POST /collective_rpc``
(``reload_weights``) and ``GET /is_sleeping``, each taking the seconds measured on vLLM 0.25 with the
27B's shape on one H100 (issue #61; docs/calibrate.md, bench/gpu/results/2026-12-06c-h100-vllm),
times ``time_scale``.

What the real server does that the simulator keeps: any sleep empties the prefix cache; level 1
parks the weights in host RAM (a wake brings them back), level 2 drops them (a wake of the weights
gives garbage until ``reload_weights``); the first level-1 sleep of a process is slow (its host
buffers are allocated then). A generation request while asleep is answered 503: vLLM 0.25 has no
answer for one (vllm-project/vllm#15483; it crashed or hung), and a gateway must never send one.
"""

from __future__ import annotations

import asyncio
from typing import Any, cast

import msgspec
from litestar import Request, Response, get, post

from backends.sim.http_common import json_response, read_json
from backends.sim.prefix_cache import BlockCache
from backends.sim.sleep_state import SleepState
from backends.sim.vllm_engine import VllmEngine

AnyRequest = Request[Any, Any, Any]


def sleep_of(request: AnyRequest) -> tuple[VllmEngine, SleepState]:
    engine = cast(VllmEngine, request.app.state.sim)
    state = engine.sleep_state
    assert state is not None  # the handlers are mounted only with enable_sleep_mode
    return engine, state


async def _take(engine: VllmEngine, seconds: float) -> None:
    await asyncio.sleep(seconds * engine.config.time_scale)


@post("/sleep", status_code=200)
async def sleep(request: AnyRequest) -> Response[bytes]:
    """Sleep at ``?level=`` (default 1): the KV cache (the prefix cache with it) is dropped, the
    weights parked in host RAM (1) or dropped (2); requests still running are aborted."""
    engine, state = sleep_of(request)
    raw = request.query_params.get("level", "1")
    level = int(raw) if raw in ("1", "2") else 0
    if level not in (1, 2):
        return json_response({"error": f"level must be 1 or 2, not {raw!r}"}, 400)
    if state.sleeping:  # asleep, or falling asleep (a second call while the first runs)
        return Response(b"", status_code=200)
    state.level = level  # asleep from the first moment: no request starts during the sleep itself
    for task in [*engine.running, *engine.waiting]:
        engine.cancel(task)
    seconds = state.times.level2_s if level == 2 else state.times.level1_s
    if level == 1 and not state.slept_before:
        seconds = state.times.level1_first_s
    state.slept_before = True
    await _take(engine, seconds)
    state.kv_cache = False
    state.weights = "cpu" if level == 1 else "none"
    if engine.cache is not None:
        engine.cache = BlockCache(engine.cache.block, engine.cache.capacity_blocks)
    return Response(b"", status_code=200)


@post("/wake_up", status_code=200)
async def wake_up(request: AnyRequest) -> Response[bytes]:
    """Wake the weights, the KV cache, or both (no ``tags``)."""
    engine, state = sleep_of(request)
    tags = request.query_params.getall("tags", []) or ["weights", "kv_cache"]
    if not state.sleeping:
        return Response(b"", status_code=200)
    if state.level == 1:
        await _take(engine, state.times.wake1_s)
        state.weights, state.kv_cache = "gpu", True
    else:
        if "weights" in tags and state.weights == "none":
            await _take(engine, state.times.wake_weights_s)
            state.weights = "garbage"
        if "kv_cache" in tags and not state.kv_cache:
            await _take(engine, state.times.wake_kv_s)
            state.kv_cache = True
    if state.kv_cache and state.weights in ("gpu", "garbage"):
        state.level = 0
    return Response(b"", status_code=200)


@post("/collective_rpc", status_code=200)
async def collective_rpc(request: AnyRequest) -> Response[bytes]:
    """``{"method": "reload_weights"}``: the weights read again (after a level-2 sleep)."""
    engine, state = sleep_of(request)
    try:
        body = await read_json(request)
    except msgspec.DecodeError:
        body = None
    method = body.get("method") if isinstance(body, dict) else None
    if method != "reload_weights":
        return json_response({"error": f"unknown method {method!r}"}, 400)
    if state.weights in ("garbage", "gpu") and state.level != 1:
        if state.weights == "garbage":
            await _take(engine, state.times.reload_weights_s)
            state.weights = "gpu"
        return json_response({"results": [None]})
    return json_response({"error": "the weights are not on the GPU: wake them first"}, 400)


@get("/is_sleeping", sync_to_thread=False)
def is_sleeping(request: AnyRequest) -> Response[bytes]:
    _, state = sleep_of(request)
    return json_response({"is_sleeping": state.sleeping})


def answers_while_asleep(engine: VllmEngine) -> Response[bytes] | None:
    """A generation request while asleep (or woken at level 2 without its weights reloaded): 503."""
    state = engine.sleep_state
    if state is None or (not state.sleeping and state.weights == "gpu"):
        return None
    message = "The engine is sleeping: wake it (POST /wake_up) before sending requests"
    if not state.sleeping:
        message = "The weights were not reloaded after a level-2 sleep (POST /collective_rpc reload_weights)"
    return json_response({"error": {"message": message, "type": "ServiceUnavailable", "code": 503}}, 503)


SLEEP_HANDLERS = (sleep, wake_up, collective_rpc, is_sleeping)
