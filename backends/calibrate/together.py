"""A decode step timed while every sequence decodes: the stretch after the last one's first token.

Sequences sent together do not decode together at first. An engine prefills their prompts in chunks
(vLLM's ``--max-num-batched-tokens``, llama.cpp's ``--batch-size``) between the decode steps of those
already answering, so the first tokens of a sequence come at the pace of the others' prefill. Timed
from each sequence's own first token, as ``turnout calibrate`` did until 2026-12-06, 8 sequences of
4k tokens on vLLM (a 27B on one H100) took 152.7 ms a step where the engine decodes 16 of them at
23 ms: the fitted profile charged decode 2.6 ms per 1k tokens of context that were the others'
prefill, and turnout predicted the end of an answer 25-59% early (``bench/gpu/results/
2026-12-06c-h100-vllm``).

``decode_together`` streams every sequence until all have answered and each has made ``n_tokens``
more tokens after the last first token (the barrier), then closes the streams (both engines abort a
request whose client left). The step is each sequence's time over its tokens after the barrier; the
slowest sequence's counts (a step is as long as its slowest member).
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Awaitable, Callable, Sequence

Tick = Callable[[], bool]
"""Called by a stream for each token it receives: records the time, and says whether to stop."""
Stream = Callable[[Tick], Awaitable[None]]
"""One sequence: streams its answer, calling the tick once a token, until the tick says stop (or
the answer ends)."""


async def decode_together(streams: Sequence[Stream], n_tokens: int) -> float:
    """Seconds per decode step with ``len(streams)`` sequences decoding together (see the module)."""
    times: list[list[float]] = [[] for _ in streams]
    enough = asyncio.Event()

    def barrier() -> float | None:
        return max(t[0] for t in times) if all(times) else None

    def ticker(index: int) -> Tick:
        def tick() -> bool:
            times[index].append(time.perf_counter())
            start = barrier()
            if start is not None and all(_after(t, start) > n_tokens for t in times):
                enough.set()
            return enough.is_set()

        return tick

    await asyncio.gather(*(stream(ticker(i)) for i, stream in enumerate(streams)))
    return step_seconds(times)


def step_seconds(times: Sequence[Sequence[float]]) -> float:
    """The slowest sequence's seconds per token after the barrier (the last first token); a sequence
    that ended before it (its answer was too short to meet the others) counts from its own first."""
    present = [t for t in times if t]
    if not present:
        raise ValueError("no sequence streamed a token")
    start = max(t[0] for t in present)
    steps = []
    for t in present:
        span = [x for x in t if x >= start] if _after(t, start) >= 2 else list(t)
        if len(span) >= 2:
            steps.append((span[-1] - span[0]) / (len(span) - 1))
    if not steps:
        raise ValueError("no sequence streamed two tokens")
    return max(steps)


def _after(times: Sequence[float], start: float) -> int:
    return sum(1 for x in times if x >= start)
