"""llama-server's slot rules, as the cost model predicts them (``policies.slots`` weighs each slot with
them): what a cache reuses of a shared prefix (``reuse``: whole blocks for vLLM, every token for
llama.cpp), what a slot or RAM-cache entry gives by the engine's rules (``usable``: on a hybrid model
the newest context checkpoint within the shared prefix, or one near the end of what it holds), which
checkpoints a slot keeps after each prompt (``checkpoints_after``), when llama-server consults its RAM
prompt cache instead of the slot (``consults_ram``), and how much must fit in that cache for an entry
to still be there (``ram_span``).
"""

from __future__ import annotations

import math
from collections.abc import Sequence

from policies.checkpoints import DEFAULT_GAP, checkpoint_positions
from policies.learning import DeploymentStats, reusable
from policies.types import Deployment, PrefixMatch, SlotMatch

SIMILARITY_THRESHOLD = 0.1  # llama-server's --slot-prompt-similarity
MAX_CHECKPOINTS = 32
"""Context checkpoints llama-server keeps per slot (``--ctx-checkpoints``), the oldest out first."""


def reuse(
    shared: int, stats: DeploymentStats, ratio: float, *, token_exact: bool, reported: int | None = None
) -> int:
    """Tokens of a ``shared`` prefix the engine should reuse: whole blocks of ``shared - 1`` times ``ratio``.
    A block cache (vLLM) reuses whole blocks: of the size it ``reported`` (its prefix cache is on) and
    the hits learned so far, the greatest common divisor; one that reports none and never hit predicts
    nothing."""
    block = 1 if token_exact else math.gcd(stats.block, reported or 0)
    if shared <= 0 or not block:
        return 0
    return round(reusable(shared, block) * ratio / block) * block


def checkpoint_gap(deployment: Deployment) -> int:
    """How far before a prompt's end ``deployment``'s llama-server takes its first near-end context
    checkpoint: its profile's ``min(batch, 4 + ubatch)`` (``DEFAULT_GAP`` without a profile). A prompt
    that diverges from a slot between there and 4 tokens before the slot's end restores the one there
    (a trace replayed from hashed blocks does every turn: the template's tail differs)."""
    profile = deployment.profile
    return profile.prefill.checkpoint_gap if profile is not None else DEFAULT_GAP


def ram_span(match: PrefixMatch) -> int:
    """Tokens turnout sent to the backend since the matched prompt began: what must fit in the RAM
    cache for it to still be there (the cache drops its oldest entries first)."""
    return match.recent_age + match.recent_held if match.recent else 0


def checkpoints_after(
    previous: Sequence[int],
    tokens: int,
    cached: int | None,
    gap: int = DEFAULT_GAP,
    user_start: int = -1,
    first_user: int = -1,
) -> tuple[int, ...]:
    """The context checkpoints (token offsets, oldest first) a hybrid llama.cpp slot holds after a
    prompt of ``tokens`` tokens that reused ``cached`` of the slot's state (the engine's count): those
    of ``previous`` at or below ``cached`` (the engine erases the ones past what it reused), then
    ``max(cached, tokens - gap)``, ``max(cached, tokens - 4)`` and the last user message's start
    (``user_start``) when it was processed, and on a cold prompt where the first user message starts
    (``first_user``; ``policies.checkpoints``), each if positive (the engine checkpoints each step near
    the prompt's end as it starts); the newest ``MAX_CHECKPOINTS``. With ``cached`` unknown (None)
    none of ``previous`` is kept."""
    start = cached or 0
    kept = [c for c in previous if c <= start] if cached is not None else []
    for position in checkpoint_positions(tokens, start, gap, user_start, first_user):
        if position in kept:
            kept.remove(position)
        kept.append(position)
    return tuple(kept[-MAX_CHECKPOINTS:])


def usable(match: SlotMatch, hybrid: bool, gap: int = DEFAULT_GAP) -> int:
    """Tokens of a slot's (or RAM entry's) state the engine's rules let it reuse: all it shares with
    the prompt when the prompt extends it; for a hybrid model that diverges inside it, the later of
    the slot's newest checkpoint within the shared prefix (``match.checkpoint``: possibly one an
    earlier prompt left) and a checkpoint near the end of what it holds (N - ``gap`` or later), else
    nothing. A RAM entry's checkpoints are not tracked: only the near-end one counts for it. Learning
    measures ``reuse`` against this, not against the shared prefix: a hybrid slot sharing only a
    system prompt, with no checkpoint inside it, gives nothing by the rules, and its miss says
    nothing about the engine's reuse."""
    tokens = match.tokens
    if hybrid and not match.whole and match.held:
        near_end = match.held > gap and tokens >= match.held - gap
        tokens = max(match.checkpoint, match.held - gap if near_end else 0)
    return tokens


def consults_ram(match: SlotMatch, prompt_tokens: int) -> bool:
    """Whether llama-server loads from its RAM cache for a prompt pinned to this slot: when the slot
    shares no more than the similarity threshold with the prompt, or keeps less than half of what it
    holds (``f_keep < 0.5``). A slot holding a conversation that shares a long system prompt with
    this one is reused as it is, even when the RAM cache holds this conversation whole."""
    return consults_ram_by_counts(match.tokens, prompt_tokens, match.held)


def consults_ram_by_counts(shared: int, prompt_tokens: int, held: int) -> bool:
    """``consults_ram`` for a slot holding ``held`` tokens, ``shared`` of them a prefix of the prompt."""
    return shared <= SIMILARITY_THRESHOLD * prompt_tokens or not held or shared < held / 2
