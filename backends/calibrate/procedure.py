"""``turnout calibrate``: measure one idle engine and fit its engine profile (``policies.engine_profile``).

The procedure, in order, each step skipped (and said so in the profile's ``notes``) when what is
left of ``--budget`` would not cover it at the rate measured so far:

1. **Cold prefills** (after one not counted: an engine's first request sets things up) of fresh
   prompts from 16 tokens to 90% of the window, at sizes chosen around the micro-batch (half of
   one, one and a bit, a whole step and a bit), then a quarter, a half and 90% of the window;
   shortest first, so each estimate extrapolates from measured ones. Then **prefills after cached
   tokens**: a conversation of a quarter of the window grows by half a micro-batch, then by a step
   and a half, on its own slot (the points that tell attention's cost apart). llama.cpp with two
   slots or more: a **RAM-cache save** timed at two sizes (``saves``): each cold prefill on slot 0
   waited for the server to save the prompt before it, and that is taken out of every point (its
   cost goes to ``cache.ram_save_s`` and ``ram_save_token_s``). Then a **context checkpoint
   restore** and **take** (``restore``): slot 1's conversation grows by 16 tokens, by 16 after
   diverging 2 tokens before its end, and by 4 (``cache.checkpoint_restore_s`` and
   ``prefill.checkpoint_s``, which the fit takes out of every point; hybrid models only).
2. **Decode steps** for 1, 2, ... sequences together (up to the slots, at most 4; vLLM 1 to 8) at a
   short and a long context.
3. **Scenarios**, each against the profile's cold prefill of the same prompt
   (llama.cpp): a turn appended on its slot (``warm``), an edit inside the prompt after it (reuse
   from the last checkpoint before the edit: ``checkpoint``), and the same conversation back on its
   slot after another one took it (``ram``: the RAM prompt cache, whose restore cost per token is
   what the profile keeps); (vLLM) the same prompt twice at two lengths (``prefix``: the block size
   the prefix cache reuses a hybrid model's prompt in, if at all).

Cold prefills and decode steps are measured ``repeat`` times (2 by default, where cheap) and the
fastest kept (a prefill's once the saves it waited for are out). Prefill and decode coefficients
are fitted to the points (``policies.profile_fit``); the scenario checks show how far the fitted
profile is from what happened. Every llama.cpp slot used is erased at the end (the RAM cache keeps
what it saved: llama-server has no call to empty it).
"""

from __future__ import annotations

import math
from collections.abc import Sequence

from msgspec.structs import replace

from backends.calibrate import restore
from backends.calibrate.engines import CalibrationError, Engine, Prefill
from backends.calibrate.grid import DECODE_TOKENS, growths, prefill_sizes
from backends.calibrate.run import Clock, Options, Progress, Run
from backends.calibrate.saves import PROBE_TOKENS, TURNS, measure
from policies.engine_profile import (
    OFFLOAD_MIN_BATCH,
    CacheModel,
    Check,
    DecodeModel,
    EngineProfile,
    Point,
    PrefillModel,
)
from policies.profile_fit import fit_decode, fit_prefill

RESERVE = 0.25
"""Of the budget kept back from the prefill grid for the decode steps and the scenarios."""


async def calibrate(engine: Engine, options: Options, *, clock: Clock, progress: Progress) -> EngineProfile:
    """Measure ``engine`` (idle, or :class:`CalibrationError`) and return its fitted profile."""
    busy = await engine.busy()
    if busy:
        raise CalibrationError(
            f"the engine is busy ({busy} request(s) running or queued): calibrate measures an idle engine;"
            " stop its traffic (or drain it in turnout's dashboard) and try again"
        )
    info = engine.info
    window = min(info.window or 4096, options.window or info.window or 4096)
    llama = info.engine == "llamacpp"
    batch = options.batch or 2048
    ubatch = options.ubatch or (512 if llama else batch)
    shape = PrefillModel(
        token_s=1.0,
        ubatch=ubatch,
        batch=batch,
        batch_min=OFFLOAD_MIN_BATCH if llama else 1,
        checkpoint_splits=llama and options.checkpoint_splits,
    )
    run = Run(engine, options, clock, progress, clock(), shape)
    run.book.gap = shape.checkpoint_gap  # the server's, by its flags
    try:
        await _prefill_grid(run, window)
        if llama:
            await _restore(run)
            await _saves(run, window)
        shape = replace(shape, checkpoint_s=round(run.checkpoint_s, 6))
        prefill = fit_prefill(shape, run.prefill, attention=any(p.b > 0 for p in run.prefill))
        await _decode_grid(run, window, slots=info.slots if llama else 8)
        decode = fit_decode(run.decode) if run.decode else DecodeModel(step_s=0.05)
        if not run.decode:
            run.notes.append("no decode step measured (budget): decode.step_s is a placeholder 0.05 s")
        draft = EngineProfile(name=options.name, engine=info.engine, prefill=prefill, decode=decode)
        checks, cache = await (
            _llama_checks(run, draft, window) if llama else _vllm_checks(run, draft, window)
        )
        if cache.prefix_block and not llama:  # vLLM's align mode cut the steps measured: fit them so
            prefill = fit_prefill(
                shape,
                run.prefill,
                attention=any(p.b > 0 for p in run.prefill),
                align=cache.prefix_block,
            )
            aligned = EngineProfile(
                name=options.name, engine=info.engine, prefill=prefill, decode=decode, cache=cache
            )
            checks = [
                replace(c, predicted_s=round(aligned.prefill_seconds(c.prompt - c.cached, c.cached), 6))
                for c in checks
            ]
    finally:
        for slot in sorted(run.used_slots):
            await engine.erase(slot)
    return EngineProfile(
        name=options.name,
        engine=info.engine,
        prefill=prefill,
        decode=decode,
        cache=cache,
        model=info.model,
        source=options.source,
        context_window=window,
        machine=options.machine,
        prefill_points=tuple(run.prefill),
        decode_points=tuple(run.decode),
        checks=tuple(checks),
        notes=(*info.notes, *run.notes),
    )


async def _prefill_grid(run: Run, window: int) -> None:
    sizes = prefill_sizes(window, run.shape.ubatch, run.shape.batch)
    base = window // 4
    grown = growths(window - DECODE_TOKENS - 8 - base, run.shape.ubatch, run.shape.batch)
    steps = len(sizes) + len(grown)
    # an engine's first request pays its one-time setup (the H100's 27B on llama.cpp: 311 ms for 16
    # tokens in its own prompt_ms, 197 ms the second time): sent first, not a point
    await run.prefill_on(run.engine.prompt(sizes[0]))
    for index, n in enumerate(sizes, 1):
        guess = run.rate_s(n)
        if len(run.prefill) >= 2 and guess > run.left() * (1 - RESERVE):
            skipped = [s for s in sizes if s >= n]
            run.notes.append(
                f"coarser grid: cold prefills of {', '.join(map(str, skipped))} tokens skipped"
                f" (~{guess:.0f} s each, {run.left():.0f} s of the budget left)"
            )
            break
        run.say(index, steps, f"cold prefill of {n:,} tokens (~{guess:.0f} s)")
        tries = [await run.prefill_on(run.engine.prompt(n)) for _ in range(run.repeat(guess))]
        run.add_point(*tries)
    if len(run.prefill) < 2:
        raise CalibrationError("fewer than two prefills measured: give calibrate a larger --budget")
    # after cached tokens: a conversation of ``base`` tokens on slot 1 grows turn by turn
    guess = run.rate_s(base + sum(grown))
    if guess > run.left() * (1 - RESERVE):
        run.notes.append(f"no prefill after cached tokens measured (~{guess:.0f} s, budget)")
        return
    slot = 1 if run.engine.info.slots > 1 else 0
    conversation = run.engine.prompt(base)
    await run.prefill_on(conversation, slot)
    for index, grow in enumerate(grown, len(sizes) + 1):
        run.say(index, steps, f"{grow:,} tokens after {len(conversation):,} cached")
        conversation += run.engine.prompt(grow)
        run.add_point(await run.prefill_on(conversation, slot))


async def _decode_grid(run: Run, window: int, *, slots: int) -> None:
    batches = [b for b in (1, 2, 4, 8) if b <= max(1, min(slots, 8))]
    contexts = [64, min(window // 4, 4096)]
    plan = [(b, c) for c in contexts for b in batches]
    for index, (b, context) in enumerate(plan, 1):
        guess = run.rate_s(context) * b + DECODE_TOKENS * 0.5
        if run.decode and guess > run.left() * 0.6:
            run.notes.append(f"decode at {context} tokens of context with {b}+ sequences skipped (budget)")
            break
        run.say(index, len(plan), f"decode, {b} sequence(s) at {context:,} tokens")
        prompts = [run.engine.prompt(context) for _ in range(b)]
        run.used_slots.update(range(b))
        run.book.together(prompts)
        step = min([await run.engine.decode(prompts, DECODE_TOKENS) for _ in range(run.repeat(guess))])
        run.decode.append(Point(b, b * (context + DECODE_TOKENS // 2), round(step, 6)))


async def _saves(run: Run, window: int) -> None:
    """Time a RAM-cache save (``saves.measure``) and take the saves out of the prefill points."""
    sizes = [min(1024, window // 8), min(8192, window // 4)]
    if run.engine.info.slots < 2:
        run.notes.append("RAM-cache saves not timed (one slot): ram_save_s unknown")
        return
    guess = run.rate_s(sum(sizes) + sizes[0]) * 4 + 3 * TURNS * run.rate_s(PROBE_TOKENS)
    if guess > run.left() * RESERVE:  # each size three times, a conversation's turns, and a margin
        run.notes.append("RAM-cache saves not timed (budget): ram_save_s unknown")
        return
    run.say(1, 1, f"RAM-cache saves of {sizes[0]:,} and {sizes[1]:,} tokens, then after {TURNS} turns")

    saves = await measure(run.prefill_on, run.book, run.engine.prompt, sizes)
    if saves is None:
        run.notes.append(
            "RAM-cache saves not timed: slot 1 lost its prompt while slot 0 was saved (--kv-unified clears"
            " idle slots): ram_save_s unknown, the prefill points keep the saves they waited for"
        )
        return
    run.saves = saves
    run.without_saves()


async def _restore(run: Run) -> None:
    """Time a context checkpoint's restore and take on slot 1 (``restore.measure``); a model that
    restores none keeps no checkpoints, and the saves are booked without them."""
    if run.rate_s(256) * 12 > run.left() * RESERVE:
        run.notes.append(
            "context checkpoints not timed (budget): checkpoint_restore_s and checkpoint_s unknown"
        )
        return
    slot = 1 if run.engine.info.slots > 1 else 0
    run.say(1, 1, f"context checkpoints restored and taken (slot {slot}, 3 rounds)")
    draft = EngineProfile(
        name="draft",
        engine="llamacpp",
        prefill=fit_prefill(run.shape, run.prefill, attention=any(p.b > 0 for p in run.prefill)),
        decode=DecodeModel(step_s=1.0),
    )  # only its price of a few more tokens is used
    measured = await restore.measure(
        run.prefill_on, run.engine.prompt, run.saves.without, draft.prefill_seconds, slot=slot
    )
    if measured is None:
        run.notes.append("no context checkpoint restored (not a hybrid model, or --ctx-checkpoints 0)")
        run.book.hybrid = False
        return
    run.restore_s, run.checkpoint_s = measured.restore_s, measured.take_s


async def _llama_checks(run: Run, draft: EngineProfile, window: int) -> tuple[list[Check], CacheModel]:
    n = min(window // 2, max(p.a for p in run.prefill))
    half, grow = n // 2, min(200, max(window - n - DECODE_TOKENS - 8, 1))
    if draft.prefill_seconds(n) * 2.5 > run.left():
        run.notes.append(
            "warm, checkpoint and RAM-cache scenarios skipped (budget): ram_restore_token_s unknown"
        )
        return [], _cache(run)
    conversation = run.engine.prompt(n + grow)
    run.say(1, 4, f"a {half:,}-token turn on slot 0 (leaves checkpoints)")
    await run.prefill_on(conversation[:half])
    run.say(2, 4, f"warm: the conversation grows to {n:,} tokens on its slot")
    warm = await run.prefill_on(conversation[:n])
    checks = [_check("warm", n, warm, draft, restore_s=run.saved_s(warm))]
    edit = conversation[: (half + n) // 2] + run.engine.prompt(n - (half + n) // 2)
    run.say(3, 4, f"checkpoint: an edit at token {(half + n) // 2:,} of {n:,}")
    edited = await run.prefill_on(edit)
    restored = run.restore_s if 0 < edited.cached < (half + n) // 2 else 0.0
    checks.append(_check("checkpoint", n, edited, draft, restore_s=run.saved_s(edited) + restored))
    await run.prefill_on(conversation[:n])  # the conversation back on slot 0 (from its checkpoints or cold)
    other = run.engine.prompt(n)
    run.say(4, 4, "ram: another conversation takes slot 0, then the first one comes back")
    await run.prefill_on(other)
    back = await run.prefill_on(conversation[: n + grow])
    ram_token_s = 0.0
    if back.cached >= n // 2:
        rest = draft.prefill_seconds(back.processed, back.cached)  # and the save of ``other`` first
        ram_token_s = run.saves.without(back.seconds - rest, back.saved) / back.cached
    else:
        run.notes.append(
            f"no RAM-cache restore seen ({back.cached} of {n} tokens came back): --cache-ram 0, or too small"
        )
    cache = _cache(run, ram_token_s)
    checks.append(
        _check("ram", n + grow, back, draft, restore_s=back.cached * ram_token_s + run.saved_s(back))
    )
    return checks, cache


def _cache(run: Run, ram_restore_token_s: float = 0.0) -> CacheModel:
    """llama.cpp's cache costs as measured: the RAM restore, the saves, a checkpoint's restore."""
    saves = run.saves
    return CacheModel(
        ram_restore_token_s=round(ram_restore_token_s, 9),
        ram_save_s=round(saves.fixed, 6),
        ram_save_token_s=round(saves.per_token, 9),
        ram_save_checkpoint_s=round(saves.per_checkpoint, 6),
        checkpoint_restore_s=round(run.restore_s, 6),
    )


async def _vllm_checks(run: Run, draft: EngineProfile, window: int) -> tuple[list[Check], CacheModel]:
    hits: list[int] = []
    checks: list[Check] = []
    for n in (min(window // 4, 3000), min(window // 2, 5000)):
        if draft.prefill_seconds(n) * 2.5 > run.left():
            run.notes.append(f"prefix-cache scenario at {n} tokens skipped (budget)")
            continue
        run.say(len(hits) + 1, 2, f"prefix: the same {n:,}-token prompt twice")
        tokens = run.engine.prompt(n)
        first = await run.engine.prefill(tokens)
        second = await run.engine.prefill(tokens)
        hits.append(second.cached)
        checks.append(
            Check("prefix", n, second.cached, round(second.seconds, 6), round(first.seconds, 6),
                  round(draft.prefill_seconds(n - second.cached, second.cached), 6))
        )  # fmt: skip
    block = _block(run, hits)
    if not block:
        run.notes.append(
            "vLLM reused no prompt prefix (a hybrid model on vLLM <= 0.24, or prefix caching off)"
        )
    return checks, CacheModel(prefix_block=block)


def _block(run: Run, hits: Sequence[int]) -> int:
    """The prefix-cache block of the ``hits`` (cached tokens of prompts sent twice): the one vLLM's
    ``/metrics`` reports where every hit is whole blocks of it, else their greatest common divisor
    (which a 784-token block's hits of 2,352 and 4,704 would give as 2,352: two prompts need not
    tell the block)."""
    if not hits or not all(hits):
        return 0
    reported = run.engine.info.block
    if reported > 0 and all(hit % reported == 0 for hit in hits):
        return reported
    if reported > 0:
        run.notes.append(
            f"vLLM reports a {reported}-token block, its hits {list(hits)} are not whole blocks of it"
        )
    return math.gcd(*hits)


def _check(name: str, prompt: int, got: Prefill, draft: EngineProfile, *, restore_s: float = 0.0) -> Check:
    """``restore_s``: what the request waited for besides its prefill (a RAM restore, saves)."""
    predicted = draft.prefill_seconds(got.processed, got.cached) + restore_s
    return Check(
        name,
        prompt,
        got.cached,
        round(got.seconds, 6),
        round(draft.prefill_seconds(prompt), 6),
        round(predicted, 6),
    )
