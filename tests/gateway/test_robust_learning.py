"""One bad sample does not move routing (issue #59): a router fed a 30x outlier makes every decision
the router fed the truth makes; learned the old way (a plain EWMA), the same outlier moves some.

The routers are the workstation's pair: vLLM (busy: a queue) and a two-slot llama-server (idle)
serving one model, their rates learned from a few ordinary answers first. The outlier is the one the
issue saw: a streamed answer on vLLM whose first token was recorded 0.052 s after a 75,890-token
prompt was sent (its envelope event, not a token), where the client saw it after 11.58 s: a prefill
rate 30x too fast (set aside), and a decode rate 12x too slow (the whole answer counted as decoding:
learned, as a busy engine's would be, and bounded to 2x).
"""

from __future__ import annotations

import asyncio
import time

import httpx
import pytest

from backends.base import BackendSpec
from backends.fleet import Fleet
from gateway.routing import Router
from gateway.state.memory import MemoryStore
from policies import BUILTIN_PROFILES, Architecture, Deployment, Endpoint, EngineKind, Health, extract
from policies import ewma as ewma_module
from policies.decision import Outcome
from policies.types import BackendSnapshot, SlotState, Usage

VLLM = Deployment("m", "vllm", "m", 94_000, Architecture.HYBRID)
LLAMA = Deployment("m", "llama", "m", 65_536, Architecture.HYBRID)
PROMPTS = (200, 1_000, 3_000, 6_000, 10_000, 20_000, 40_000)  # words: ~1.3 tokens each


def router(client: httpx.AsyncClient) -> Router:
    specs = [
        BackendSpec("vllm", EngineKind.VLLM, "http://127.0.0.1:9", deployments=(VLLM,)),
        BackendSpec("llama", EngineKind.LLAMACPP, "http://127.0.0.1:10", deployments=(LLAMA,)),
    ]
    fleet = Fleet(specs, client)
    now = time.time()
    # vLLM busy (its queue against llama.cpp's idle slots): the choice depends on the rates
    fleet.observe(BackendSnapshot("vllm", EngineKind.VLLM, Health.READY, now, (VLLM,), running=4, queued=3))
    slots = (SlotState(0, 32_768, False), SlotState(1, 32_768, False))
    fleet.observe(
        BackendSnapshot("llama", EngineKind.LLAMACPP, Health.READY, now, (LLAMA,), slots=slots, total_slots=2)
    )
    return Router(fleet, MemoryStore(), BUILTIN_PROFILES["cost"])


def answer(
    deployment: Deployment, prompt: int, ttft_s: float, kind: EngineKind, duration_s: float | None = None
) -> Outcome:
    duration = ttft_s + 1.0 if duration_s is None else duration_s
    return Outcome(
        deployment.backend_id, "m", kind, Usage(prompt, 40, 0), ttft_s, duration, prompt * 4, 0, True
    )


def ordinary(r: Router) -> None:
    """A few answers at the engines' prior rates: the learned values rest on measurements."""
    vllm_rate = r.learned.for_deployment(VLLM, EngineKind.VLLM).prefill_tok_s.value
    for prompt in (4_000, 8_000, 12_000):
        r.absorb(answer(VLLM, prompt, prompt / vllm_rate, EngineKind.VLLM), VLLM)


async def choices(r: Router) -> list[str | None]:
    out = []
    for words in PROMPTS:
        body = {"model": "m", "messages": [{"role": "user", "content": "word " * words}], "max_tokens": 300}
        features = extract(body, Endpoint.CHAT, model="m", headers={})
        decision = (await r.decide(features, None)).decision
        out.append(decision.chosen.backend_id if decision.chosen else None)
    return out


SEEN_S, RECORDED_S, DURATION_S = 11.58, 0.052, 12.4  # the client's first token, the envelope's, the end


async def told_the_truth_and_not() -> tuple[list[str | None], list[str | None], Router]:
    """The same decisions made by two routers with the same history, one told the truth about the
    long answer and one told its envelope event's time (routing itself counts what it saw: each
    router is asked once)."""
    async with httpx.AsyncClient() as client:
        truth, fed = router(client), router(client)
        ordinary(truth)
        ordinary(fed)
        truth.absorb(answer(VLLM, 75_890, SEEN_S, EngineKind.VLLM, DURATION_S), VLLM)
        fed.absorb(answer(VLLM, 75_890, RECORDED_S, EngineKind.VLLM, DURATION_S), VLLM)
        return await choices(truth), await choices(fed), fed


def test_one_outlier_changes_no_decision() -> None:
    truthful, fed, r = asyncio.run(told_the_truth_and_not())
    assert fed == truthful
    stats = r.learned.for_deployment(VLLM, EngineKind.VLLM)
    assert stats.prefill_tok_s.aside == 1  # 30x fast: set aside, and shown
    assert stats.prefill_tok_s.last_aside > 10 * stats.prefill_tok_s.value
    decode = stats.decode_tok_s  # 12x slow (the whole answer counted as decoding): learned, bounded
    assert decode.aside == 0


def test_the_same_outlier_learned_as_a_plain_mean_moves_decisions(monkeypatch: pytest.MonkeyPatch) -> None:
    """The control: with no set-aside and no step bound, the fed router's choices move."""
    monkeypatch.setattr(ewma_module, "FAR", float("inf"))
    monkeypatch.setattr(ewma_module, "MAX_STEP", float("inf"))
    truthful, fed, _ = asyncio.run(told_the_truth_and_not())
    assert len(set(truthful)) == 2, truthful  # both engines win some: the rates decide
    assert fed != truthful
