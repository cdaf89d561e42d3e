"""Online learning: engine rates and cache behaviour, as bounded EWMAs over real outcomes.

``learn(state, outcome)`` is a pure function returning a new state; the gateway calls it once per
finished request. Nothing else changes what routing believes.

Per deployment (``backend/model``):

- ``prefill_tok_s``: llama.cpp ``prompt_n / prompt_ms``; others: uncached prompt tokens / TTFT
  (streams only, at least 64 uncached tokens, and only when nothing else was running or queued
  there: a TTFT under load measures the queue, not the prefill). With an engine profile
  (``policies.engine_profile``) the prior is the profile's cold 4k rate and each sample is that
  prior times ``predicted / measured`` seconds: learning corrects the profile's level, the profile
  keeps its shape (``policies.pricing``).
- ``decode_tok_s``: llama.cpp ``(predicted_n - 1) / predicted_ms`` ("the first token is free");
  others: ``(completion_tokens - 1) / (duration - ttft)`` on streams.
- ``reuse``: ``cached_tokens / reusable(shared_prefix_tokens)``, how much of what the engine could
  reuse of the conversation already sent to it it really did; ``reusable(n)`` is the whole blocks
  of ``n - 1`` tokens (an engine always recomputes at least the last prompt token). For llama.cpp,
  ``shared_prefix_tokens`` is what the slot rules allow (``policies.slots.usable``), so a hybrid
  slot that shares only a system prompt, and by the rules gives nothing, teaches nothing.
- ``ram_reuse``: the same ratio for prefixes restored from llama.cpp's RAM prompt cache (a slot
  that held another conversation loads the best saved state).
- ``ram_tokens``: how many tokens of recent prompts the RAM cache holds (it drops its oldest
  entries first). Whenever the RAM cache was consulted for an entry that began ``ram_span`` tokens
  ago, a restore shows it holds at least that many (``max``); none shows it holds fewer
  (``span * RAM_MISS_SHRINK``). A server started with ``--cache-ram 0`` soon predicts no restore.
- ``block``: the greatest common divisor of the non-zero ``cached_tokens`` seen (vLLM caches whole
  blocks; llama.cpp's token-exact reuse drives it to 1). A vLLM deployment whose engine profile
  measured its prefix block (``cache.prefix_block``, ``turnout calibrate``) starts from that block
  and a ``reuse`` of 1: a hybrid model's prompts are reused in whole blocks from the first turn
  (vLLM 0.25; the kind's prior, none, is the older releases').
- ``live``: of a hybrid llama.cpp slot's turns that continue its last prompt, the share the engine
  continued live (the prompt carried the slot's answer token for token: it reused at least the last
  prompt) rather than restoring the checkpoint before the answer (a chat turn whose answer is
  rendered back otherwise: a reasoning block dropped, tokenized anew). Prior 0.5: on the GPU the
  27B's re-rendered turns all restored, the CPU build's tiny model continued one of two.
- ``service_s``: request duration, for queue-wait estimates.
- ``queue_factor``: how much longer than predicted a predicted queue really was,
  ``(ttft - predicted ttft + predicted queue) / modelled queue`` on streams that were predicted to
  wait at least ``MIN_QUEUE_S`` (clamped to ``[1/QUEUE_SPREAD, QUEUE_SPREAD]``): queues build on
  queues, and a saturated engine's waits are longer than the sum of their parts. A factor, it is
  averaged in log space from its prior, 1 (``Ewma.update_factor``): the first sample moves it by
  ``ALPHA`` like any other instead of replacing it. Replacing it, one first token that came before
  the predicted prefill (a sample below 0, clamped to 0.1) scaled every vLLM queue by 0.1 until the
  next sample; under chat load the next came only when an answer ended, seconds of congestion
  later: the chat workload's draw 36 sent 82% of its requests to vLLM, predicted at ~1 s and
  answered at 2-4.5 s (1.31x llm-d's mean TTFT; docs/benchmarks.md, 2026-12-05, ninth session).
  Only predictions made on the deployment's own measurements teach it (``Estimate.primed``: ``PRIMED_SAMPLES``
  outcomes in), and only queues predicted at least as long as the rest of the TTFT: one made on
  priors is off by what the priors are, and a short queue's sample by the prefill prediction's
  error, not by what the queue model misses; a burst of either would scale every later queue by
  that error. vLLM only: a llama.cpp slot's queue is modelled whole (its requests' chain and the
  prefill backlog, ``policies.slots``) and its waits' spread is the unknown answer lengths of the
  requests ahead, not a bias a factor could correct (one learned there scaled every wait up).

Across deployments: ``speed``, each measured prefill rate over its prior; a deployment not measured
yet starts from its priors times ``speed`` (on a machine twice as fast as the reference box, or in a
replay's compressed time, an engine nobody has sent to yet is not believed ten times slower than
the one that was measured).

Per model: ``chars_per_token`` (prompt characters / prompt tokens) and ``completion_tokens``.
The first sample replaces the prior; later ones move it by ``ALPHA``. Every value is clamped to
``[prior / SPREAD, prior * SPREAD]`` so one odd measurement cannot derail routing. The two engine
rates are learned robustly (``policies.ewma``): one observation moves a rate at most 2x, and a
sample more than 4x faster than the learned rate is set aside (counted, shown on the dashboard)
unless the one before it was set aside too and agrees with it; a slow one is learned, bounded.

Replicas (``policies.learning_merge.merge``): each gateway learns from its own outcomes and shares
that state; routing reads the merge of its own and the others', each value their mean weighted by
samples (at most ``MERGE_WEIGHT_CAP`` each: an EWMA stands for its last few samples, not its whole
history) and ``block`` the greatest common divisor of the blocks seen. Merging never feeds back into what a
replica shares, so nothing is counted twice.
"""

from __future__ import annotations

import functools
import math
from collections.abc import Mapping
from types import MappingProxyType

import msgspec
from msgspec.structs import replace

from policies.decision import Estimate, Outcome
from policies.ewma import ALPHA, FAR, MAX_STEP, RATIO_MAX, SPREAD, Ewma
from policies.types import Architecture, Deployment, EngineKind

__all__ = ["ALPHA", "FAR", "MAX_STEP", "RATIO_MAX", "SPREAD", "Ewma"]  # re-exported: learning's vocabulary

PRIOR_PREFILL = {EngineKind.VLLM: 6600.0, EngineKind.LLAMACPP: 3000.0, EngineKind.OPENAI: 3000.0}
PRIOR_DECODE = {EngineKind.VLLM: 64.0, EngineKind.LLAMACPP: 109.0, EngineKind.OPENAI: 50.0}
PRIOR_SERVICE_S = 5.0
PRIOR_COMPLETION_TOKENS = 256.0
PRIOR_RAM_REUSE = 0.95
"""llama-server keeps an 8 GiB RAM prompt cache by default; other engines have none."""
PRIOR_RAM_TOKENS = 100_000.0
PRIOR_LIVE = 0.5
"""Tokens of recent prompts the RAM cache is believed to hold (8 GiB at ~64 KiB a token, less the
recurrent states of the saved checkpoints)."""
RAM_MISS_SHRINK = 0.5
MERGE_WEIGHT_CAP = 10
STALL_KEPT = 0.5
"""Of a measured decode, the least share a predicted stall (``Estimate.stall_s``: the other sessions'
prompts it was expected to wait for, ``policies.coming``) leaves before a rate is learned from it: a
stall predicted but not come cannot teach a rate more than twice the measured one."""
NOTHING_PREDICTED = Estimate(expected_cached_tokens=0, queue_s=0.0, ttft_s=0.0, total_s=0.0)
MIN_QUEUE_S = 0.01
QUEUE_SPREAD = 10.0
PRIMED_SAMPLES = 3
"""A deployment's outcomes before its predictions are made on measurements, not priors."""


def prior_reuse(kind: EngineKind, architecture: Architecture) -> float:
    """Before any measurement: a pinned llama.cpp slot reuses almost all of it (DOMAIN: 97-100%);
    vLLM reuses nothing of a hybrid model (none in older releases) and most of a dense one."""
    if kind is EngineKind.LLAMACPP:
        return 0.97
    if kind is EngineKind.VLLM and architecture is not Architecture.HYBRID:
        return 0.9
    return 0.0


def _ewma(prior: float) -> Ewma:
    return Ewma(prior, prior)


def reusable(tokens: int, block: int) -> int:
    """Whole blocks of ``tokens - 1``: the most of a known prefix an engine can reuse."""
    size = max(block, 1)
    return max(tokens - 1, 0) // size * size


class DeploymentStats(msgspec.Struct, frozen=True):
    prefill_tok_s: Ewma
    decode_tok_s: Ewma
    reuse: Ewma
    service_s: Ewma
    ram_reuse: Ewma = msgspec.field(default_factory=lambda: Ewma(0.0, 0.0, ratio=True))
    ram_tokens: Ewma = msgspec.field(default_factory=lambda: Ewma(PRIOR_RAM_TOKENS, PRIOR_RAM_TOKENS))
    queue_factor: Ewma = msgspec.field(default_factory=lambda: Ewma(1.0, 1.0))
    live: Ewma = msgspec.field(default_factory=lambda: Ewma(PRIOR_LIVE, PRIOR_LIVE, ratio=True))
    block: int = 0  # 0: no hit seen yet

    @property
    def primed(self) -> bool:
        """Measured: ``PRIMED_SAMPLES`` outcomes in (module docstring, ``queue_factor``)."""
        return self.service_s.samples >= PRIMED_SAMPLES

    @classmethod
    @functools.lru_cache(maxsize=256)  # immutable: every unmeasured deployment of a kind shares one
    def prior(
        cls,
        kind: EngineKind,
        architecture: Architecture,
        speed: float = 1.0,
        rates: tuple[float, float] | None = None,
        block: int = 0,
    ) -> DeploymentStats:
        """Before any measurement: the priors, rates times ``speed`` (what the other engines measured
        against their priors: a slower or faster machine, or a replay's compressed time); ``rates``:
        the deployment's engine profile's prefill and decode rates instead of the kind's; ``block``:
        the prefix-cache block its profile measured vLLM reusing prompts in (0: none measured), so
        that the first turn a fresh gateway sends back is priced with its whole blocks reused."""
        prefill, decode = rates or (PRIOR_PREFILL[kind], PRIOR_DECODE[kind])
        reuse = 1.0 if kind is EngineKind.VLLM and block > 0 else prior_reuse(kind, architecture)
        return cls(
            prefill_tok_s=Ewma(prefill * speed, prefill, rate=True),
            decode_tok_s=Ewma(decode * speed, decode, rate=True),
            reuse=Ewma(reuse, reuse, ratio=True),
            service_s=Ewma(PRIOR_SERVICE_S / speed, PRIOR_SERVICE_S),
            ram_reuse=Ewma(
                ram_prior := PRIOR_RAM_REUSE if kind is EngineKind.LLAMACPP else 0.0, ram_prior, ratio=True
            ),
            block=block if kind is EngineKind.VLLM else 0,
        )


class ModelStats(msgspec.Struct, frozen=True):
    chars_per_token: Ewma
    completion_tokens: Ewma


class LearnedState(msgspec.Struct, frozen=True):
    deployments: Mapping[str, DeploymentStats] = msgspec.field(default_factory=lambda: MappingProxyType({}))
    models: Mapping[str, ModelStats] = msgspec.field(default_factory=lambda: MappingProxyType({}))
    speed: Ewma = msgspec.field(default_factory=lambda: Ewma(1.0, 1.0))
    """Measured prefill rates over their priors, across deployments: scales an unmeasured one's prior."""
    clients: Mapping[str, Ewma] = msgspec.field(default_factory=lambda: MappingProxyType({}))
    """Answer tokens per model and client program (``client_key``: ``Outcome.client``): what an
    agent's answers run to."""

    def for_deployment(self, deployment: Deployment, kind: EngineKind) -> DeploymentStats:
        key = f"{deployment.backend_id}/{deployment.model}"
        profile = deployment.profile
        return self.deployments.get(key) or DeploymentStats.prior(
            kind,
            deployment.architecture,
            self.speed.value,
            profile_rates(deployment),
            profile.cache.prefix_block if profile is not None else 0,
        )

    def for_model(self, model: str, chars_per_token_prior: float = 3.6) -> ModelStats:
        return self.models.get(model) or _model_prior(chars_per_token_prior)


@functools.lru_cache(maxsize=64)
def _model_prior(chars_per_token: float) -> ModelStats:
    """Before any measurement of a model (immutable: shared)."""
    return ModelStats(_ewma(chars_per_token), _ewma(PRIOR_COMPLETION_TOKENS))


def client_key(model: str, client: str) -> str:
    """The key of a model's answers to one client program in ``LearnedState.clients``."""
    return f"{model} {client}"


def profile_rates(deployment: Deployment) -> tuple[float, float] | None:
    """The deployment's engine profile as the two priors (cold 4k prefill, one-stream decode)."""
    profile = deployment.profile
    return None if profile is None else (profile.prefill_tok_s(), profile.decode_tok_s())


def _rates(stats: DeploymentStats, outcome: Outcome, deployment: Deployment) -> DeploymentStats:
    """Rate samples, each the prior times how much faster than its profile the engine was: with no
    profile plain tokens over seconds; with one, a 500-token turn that paid a 6 s batch teaches the
    same rate as a 4k cold prefill that paid eight (module docstring). No prefill sample where a
    warm-up's prompt ran beside the request's (``shared_prefill``): llama-server runs every slot's
    prompt chunks in the same batches, so ``prompt_ms`` spans both (issue #45: one such sample
    taught 712 tokens/s for an engine of 3,000: every later cold prefill looked 4x slower)."""
    usage, profile = outcome.usage, deployment.profile
    cached = usage.cached_tokens or 0
    uncached, prefill_s = usage.prompt_tokens - cached, None
    if outcome.shared_prefill:
        pass  # a warm-up's prompt ran beside it (``_shared``): its prefill time spans both
    elif usage.prompt_ms is not None and usage.prompt_ms > 0 and uncached >= 16:
        prefill_s = usage.prompt_ms / 1000
    elif outcome.stream and outcome.ttft_s and uncached >= 64 and not outcome.contended:
        prefill_s = outcome.ttft_s
    if prefill_s is not None:
        if profile is None:
            sample = uncached / prefill_s
        else:
            hybrid = deployment.architecture is Architecture.HYBRID  # the checkpoints it took
            expected = profile.prefill_seconds(
                uncached, cached, outcome.user_start, first_user=outcome.first_user, checkpoints=hybrid
            )
            if restored(outcome):  # a checkpoint came back first, inside prompt_ms
                expected += profile.cache.checkpoint_restore_s
            sample = stats.prefill_tok_s.prior * expected / prefill_s
        stats = replace(stats, prefill_tok_s=stats.prefill_tok_s.update(sample))
    steps = usage.completion_tokens - 1
    decode_s: float | None = None
    if usage.predicted_ms is not None and usage.predicted_ms > 0 and steps >= 4:
        decode_s = usage.predicted_ms / 1000
    elif outcome.stream and outcome.ttft_s is not None and steps >= 4 and outcome.duration_s > outcome.ttft_s:
        decode_s = outcome.duration_s - outcome.ttft_s
    if decode_s is not None:
        rate = steps / max(decode_s - _stalled(outcome.predicted), decode_s * STALL_KEPT)
        if profile is not None:  # the profile's step at this context is longer than at none
            rate *= profile.batch_slowdown(1, usage.prompt_tokens)
        stats = replace(stats, decode_tok_s=stats.decode_tok_s.update(rate))
    return stats


def _stalled(predicted: Estimate | None) -> float:
    """The seconds a measured decode is taken to have waited for other prompts: its predicted stall,
    whole. It was priced over the decode of the answer expected (``Estimate.decode_s``), so a shorter
    answer waited for less of it and teaches a faster rate (bounded by ``STALL_KEPT``), a longer one
    for more. Scaled by the decode measured over the decode expected, the learned rates came out
    slower and routing worse in sample (the agent row's last token 2.894 / 4.377 s, mean / p90,
    against 2.544 / 3.842 with the stall taken out whole; fleet-16's wait 5.219 / 10.421 s against
    4.853 / 8.777; docs/benchmarks.md, 2026-12-07, measured while the replay still told the answer's
    length):
    the learned rate also carries the batch running beside each answer, which the prediction applies
    again (``policies.pricing.decode_step_s``), and the faster rate offsets that."""
    return predicted.stall_s if predicted is not None else 0.0


def restored(outcome: Outcome) -> bool:
    """Whether the engine restored a context checkpoint for ``outcome``, by what it reused: a turn
    predicted to resume from one (``Estimate.restores``) reused at most what the checkpoint gives;
    one that continues the slot's last prompt (``continues``) reused less than that prompt."""
    cached, shared = outcome.usage.cached_tokens or 0, outcome.shared_prefix_tokens
    predicted = outcome.predicted
    if predicted is None or cached <= 0:
        return False
    return cached <= shared if predicted.restores else predicted.continues and cached < shared


def _ram_capacity(capacity: Ewma, outcome: Outcome, predicted: Estimate) -> Ewma:
    """A restore that came back shows the RAM cache holds at least ``ram_span`` tokens; one that
    did not, that it holds less (or nothing: ``--cache-ram 0``)."""
    restored = (outcome.usage.cached_tokens or 0) >= predicted.ram_tokens / 2
    if restored:
        value = max(capacity.value, float(predicted.ram_span))
    else:
        value = min(capacity.value, predicted.ram_span * RAM_MISS_SHRINK)
    return Ewma(value, capacity.prior, capacity.samples + 1)


def _queue_sample(outcome: Outcome, predicted: Estimate) -> float | None:
    """How much longer the queue was than modelled (module docstring, ``queue_factor``): the TTFT
    less the predicted rest of it (prefill and first step), over the modelled queue. Only where the
    queue was predicted on measurements and at least as long as that rest: a short queue's sample
    is mostly the error of the prefill prediction (a prefill faster than predicted reads as a queue
    that was not there)."""
    queue, rest = predicted.modelled_queue_s, predicted.ttft_s - predicted.queue_s
    if (
        outcome.kind is EngineKind.LLAMACPP
        or not outcome.stream
        or outcome.ttft_s is None
        or not predicted.primed
        or queue < max(MIN_QUEUE_S, rest)
    ):
        return None
    return (outcome.ttft_s - rest) / queue  # clamped by Ewma.update_factor


def learn_prefill(state: LearnedState, outcome: Outcome, deployment: Deployment) -> LearnedState:
    """The state after a background warm-up on ``deployment`` (``policies.warm``): its prefill rate
    only, from llama.cpp's own timings. No client waited for it, its answer is one token, and its
    reuse was never predicted: the rest of ``learn`` would learn what it is not. With warm-ups a
    session's cold prompts are the warm-ups' (the turns after them reuse the slot): without this
    the engine's prefill rate would be learned from small prompts only."""
    key = f"{deployment.backend_id}/{deployment.model}"
    before = state.for_deployment(deployment, outcome.kind)
    stats = _rates(before, replace(outcome, stream=False), deployment)
    stats = replace(stats, decode_tok_s=before.decode_tok_s)
    if stats.prefill_tok_s.samples == before.prefill_tok_s.samples:
        return state
    speed = state.speed.update(stats.prefill_tok_s.value / stats.prefill_tok_s.prior)
    return replace(state, deployments=MappingProxyType({**state.deployments, key: stats}), speed=speed)


def learn(state: LearnedState, outcome: Outcome, deployment: Deployment) -> LearnedState:
    """The state after one more outcome of ``deployment``."""
    usage = outcome.usage
    key = f"{deployment.backend_id}/{deployment.model}"
    before = state.for_deployment(deployment, outcome.kind)
    stats = _rates(before, outcome, deployment)
    speed = state.speed
    if stats.prefill_tok_s.samples > before.prefill_tok_s.samples:
        speed = speed.update(stats.prefill_tok_s.value / stats.prefill_tok_s.prior)
    stats = replace(stats, service_s=stats.service_s.update(outcome.duration_s))
    predicted = outcome.predicted or NOTHING_PREDICTED
    from_ram = predicted.source == "ram"
    if usage.cached_tokens:
        stats = replace(stats, block=math.gcd(stats.block, usage.cached_tokens))
    possible = reusable(outcome.shared_prefix_tokens, stats.block)
    if usage.cached_tokens is not None and possible > 0:
        ratio = usage.cached_tokens / possible
        if from_ram and usage.cached_tokens >= predicted.ram_tokens / 2:
            stats = replace(stats, ram_reuse=stats.ram_reuse.update(ratio))
        elif not from_ram:
            stats = replace(stats, reuse=stats.reuse.update(ratio))
    if predicted.continues and usage.cached_tokens is not None and outcome.shared_prefix_tokens > 0:
        stats = replace(stats, live=stats.live.update(0.0 if restored(outcome) else 1.0))
    sample = _queue_sample(outcome, predicted)
    if sample is not None:
        stats = replace(stats, queue_factor=stats.queue_factor.update_factor(sample, QUEUE_SPREAD))
    if predicted.ram_tokens and usage.cached_tokens is not None:
        stats = replace(stats, ram_tokens=_ram_capacity(stats.ram_tokens, outcome, predicted))
    model = state.for_model(deployment.model)
    if usage.prompt_tokens >= 20 and outcome.prompt_chars > 0:
        model = replace(
            model, chars_per_token=model.chars_per_token.update(outcome.prompt_chars / usage.prompt_tokens)
        )
    clients = state.clients
    if usage.completion_tokens > 0:
        model = replace(model, completion_tokens=model.completion_tokens.update(usage.completion_tokens))
        if outcome.client:
            who = client_key(deployment.model, outcome.client)
            answers = clients.get(who) or _ewma(PRIOR_COMPLETION_TOKENS)
            clients = MappingProxyType({**clients, who: answers.update(usage.completion_tokens)})
    return LearnedState(
        deployments=MappingProxyType({**state.deployments, key: stats}),
        models=MappingProxyType({**state.models, deployment.model: model}),
        speed=speed,
        clients=clients,
    )
