"""Where llama-server takes a hybrid (or SWA) model's context checkpoints as it processes a prompt
(``server-context.cpp``, the pinned build): it ends a step near the prompt's end to take one, and
takes one where the last user message starts. The engine profile prices them
(``EngineProfile.checkpoints_seconds``), the simulator keeps them per slot
(``backends.sim.prefix_cache``) and the router follows them per slot (``policies.slot_rules``).
"""

from __future__ import annotations

CHECKPOINT_TAIL = 4
"""llama-server checkpoints this many tokens before a prompt's end (and ``4 + ubatch``)."""
DEFAULT_GAP = CHECKPOINT_TAIL + 512
"""The first near-end checkpoint's distance from a prompt's end, ``min(n_batch, 4 + n_ubatch)``, at
llama-server's default ``--ubatch-size 512``: for an engine with no profile (a profile's is
``PrefillModel.checkpoint_gap``; 2,048 at compose's ``--ubatch-size 2048``)."""


def checkpoint_positions(
    prompt: int, n_past: int, gap: int, user_start: int = -1, first_user: int = -1
) -> list[int]:
    """Where llama-server takes context checkpoints processing a hybrid prompt of ``prompt`` tokens from
    ``n_past`` (ascending): at ``max(n_past, prompt - gap)`` and ``max(n_past, prompt - 4)`` (it starts
    a step there), where the last user message starts (``user_start``) when it is processed, and,
    on a cold prompt (``n_past`` 0: the slot keeps no checkpoint), where the first user message
    starts (``first_user``: the server ends a step at a user message while the slot has no
    checkpoint; the end of a system prompt, which the next session sharing it restores); each only
    with something in memory before it (position > 0). Not followed: a checkpoint at each later user
    message 8,192 tokens (``--checkpoint-min-step``) or more past the previous one."""
    near = (max(n_past, prompt - gap), max(n_past, prompt - CHECKPOINT_TAIL))
    user = (user_start,) if n_past < user_start < prompt else ()
    first = (first_user,) if n_past == 0 and first_user < prompt else ()
    return sorted({p for p in (*first, *user, *near) if 0 < p < prompt})
