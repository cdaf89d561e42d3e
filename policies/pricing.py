"""What the router believes one deployment's work costs: its engine profile, scaled by what was learned.

The profile (``policies.engine_profile``) gives the shape: a prefill's micro-batches with their fixed
cost, attention growing with the context, a decode step growing with the batch. Learning
(``policies.learning``) gives the level: ``prefill_tok_s`` and ``decode_tok_s`` are EWMAs whose
priors are the profile's own nominal rates, so ``prior / value`` is how much slower (or faster) the
engine really is than its profile says, and every predicted time is scaled by it. A deployment
without a profile is linear in its learned rates (``new / prefill_tok_s``), as before profiles:
``ram_restore`` then uses ``RESTORE_TOK_S``.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence

from policies.learning import DeploymentStats
from policies.types import Architecture, Deployment, SlotState

BATCH_SLOWDOWN = 0.06
"""Without a profile: each further running request makes a decode step 6% longer."""
RESTORE_TOK_S = 200_000.0
"""Without a profile: tokens a second a llama.cpp slot loads back from its RAM cache."""
STEP_TOKENS = 2048
"""Without a profile: prompt tokens one engine step takes, as the simulators take them (vLLM's
``max_num_batched_tokens`` is 2048 or more by version, GPU and entry point; a profile's ``batch`` says)."""


def prefill_s(
    deployment: Deployment,
    stats: DeploymentStats,
    new: float,
    cached: int = 0,
    user_start: int = -1,
    *,
    first_user: int = -1,
    prompt: bool = True,
) -> float:
    """Seconds to prefill ``new`` tokens after ``cached`` reused ones, as learned so far (``new``
    may be an expectation: a fraction of a prompt; ``user_start``, ``first_user``: where its last and
    first user message start, ``EngineProfile.prefill_seconds``).
    ``prompt=False``: tokens a prompt would process besides what it does anyway, without the context
    checkpoints a prompt takes (an eviction's lost reuse: the holder's next turn takes them either way)."""
    if new <= 0:
        return 0.0
    rate = stats.prefill_tok_s
    if deployment.profile is None:
        return new / rate.value
    checkpoints = prompt and deployment.architecture is Architecture.HYBRID  # as the engine takes them
    profile = deployment.profile
    seconds = profile.prefill_seconds(
        round(new), cached, user_start, first_user=first_user, checkpoints=checkpoints
    )
    return seconds * rate.prior / rate.value


def decode_step_s(deployment: Deployment, stats: DeploymentStats, running: int, context: int = 0) -> float:
    """Seconds of one decode step with ``running`` other requests on the engine (and ``context``
    tokens in the step, the profile's attention term)."""
    rate = stats.decode_tok_s.value
    if deployment.profile is None:
        return (1 + BATCH_SLOWDOWN * running) / rate
    return deployment.profile.batch_slowdown(running + 1, context) / rate


def ram_saves_s(
    deployment: Deployment,
    slots: Sequence[SlotState],
    target: int | None,
    keeps: bool,
    checkpoints: Mapping[int, int] | None = None,
) -> float:
    """Seconds a llama-server stops for, before the request it launches on ``target`` begins, to copy
    slot states into its RAM cache (the profile's ``cache.ram_save_seconds`` each, of the tokens and
    the ``checkpoints`` turnout knows the slot holds): every idle slot turnout knows is not saved yet
    (``SlotState.unsaved``), and the target slot itself unless the request continues what it holds
    (``keeps``: llama-server saves a slot it takes for another prompt)."""
    profile = deployment.profile
    if profile is None:
        return 0.0
    held = checkpoints or {}
    saved = [s for s in slots if s.unsaved and not s.is_processing and not (s.id == target and keeps)]
    return sum(profile.cache.ram_save_seconds(s.unsaved, held.get(s.id, 0)) for s in saved)


def checkpoint_restore_s(deployment: Deployment) -> float:
    """Seconds a hybrid llama.cpp slot takes to restore a context checkpoint, as its profile measured
    (0 without one: not measured)."""
    profile = deployment.profile
    return 0.0 if profile is None else profile.cache.checkpoint_restore_s


def ram_restore_s(deployment: Deployment, tokens: float) -> float:
    """Seconds to load ``tokens`` tokens of a saved slot back from llama.cpp's RAM cache."""
    profile = deployment.profile
    if profile is None or profile.cache.ram_restore_token_s <= 0:
        return tokens / RESTORE_TOK_S
    return tokens * profile.cache.ram_restore_token_s


def interleaved_decode_s(
    deployment: Deployment, stats: DeploymentStats, running: int, tokens: float
) -> float:
    """Seconds the decode steps of ``running`` requests add to processing ``tokens`` prompt tokens
    on an engine that batches them (vLLM): every step that takes a chunk of prompt also decodes each
    running request once. Priced at the profile's decode step (or the prior rate): the learned
    ``decode_tok_s`` is measured on answers whose steps already carried other prompts' chunks."""
    if running <= 0 or tokens <= 0:
        return 0.0
    profile = deployment.profile
    if profile is None:
        steps = math.ceil(tokens / STEP_TOKENS)
        return steps * (1 + BATCH_SLOWDOWN * (running - 1)) / stats.decode_tok_s.prior
    return math.ceil(tokens / profile.prefill.batch) * profile.decode_step_seconds(running)
