"""Fitting an engine profile's coefficients to measured points (``turnout calibrate``).

Each model in ``policies.engine_profile`` is linear in its coefficients once the engine's batching is
known: a prefill of ``new`` tokens after ``cached`` is ``request_s + token_s * T + batch_s * B +
context_s * A`` with ``T`` its tokens, ``B`` its micro-batches of at least ``batch_min`` tokens and
``A`` the attention sum ``u * (p + u / 2) / 1000`` over its micro-batches; a decode step is ``step_s +
seq_s * (n - 1) + context_s * context / 1000``. So each fit is a non-negative least-squares problem
over at most four coefficients, solved exactly by trying every subset of them (15 small solves). Residuals are
relative (each point weighted by ``1 / seconds``): a 100 ms turn matters as much as a 100 s one.
"""

from __future__ import annotations

import itertools
from collections.abc import Sequence

from policies.engine_profile import (
    CacheModel,
    DecodeModel,
    EngineProfile,
    Point,
    PrefillModel,
    ProfileSchemaError,
)


def prefill_features(
    shape: PrefillModel, new: int, cached: int, *, align: int = 0
) -> tuple[float, float, float, float]:
    """``(1, T, B, A)`` of one prefill under ``shape``'s batching (module docstring); ``align``: the
    block vLLM's align mode cuts its steps to (``EngineProfile.align_block``)."""
    unit = _unit(shape, align)
    tokens = batches = attention = 0.0
    for step, context in unit.prefill_steps(new, cached):
        done = 0
        while done < step:
            u = min(shape.ubatch, step - done)
            p = context + done
            tokens += u
            batches += 1.0 if u >= shape.batch_min else 0.0
            attention += u * (p + u / 2) / 1000
            done += u
    return 1.0, tokens, batches, attention


def _unit(shape: PrefillModel, align: int) -> EngineProfile:
    """A profile of ``shape``'s batching and checkpoints, to count with (its prices are not used)."""
    return EngineProfile(
        name="unit",
        engine="vllm" if align else "llamacpp",
        prefill=shape,
        decode=DecodeModel(step_s=1.0),
        cache=CacheModel(prefix_block=align),
    )


def fit_prefill(
    shape: PrefillModel, points: Sequence[Point], *, attention: bool = True, align: int = 0
) -> PrefillModel:
    """``shape`` (its batching, and its ``checkpoint_s``: the checkpoints each point took are taken out
    of it first) with ``request_s``, ``token_s``, ``batch_s`` and ``context_s`` fitted to ``points``
    (``new``, ``cached``, ``seconds``); ``attention=False`` keeps ``context_s`` at 0 (too few long
    prompts to tell it apart); ``align``: vLLM's align-mode block, which cuts the steps. Attention adds
    to a per-token or per-batch cost, never replaces it: a fit that explains the points by attention
    alone (noisy timings of short prompts) is done again without it."""
    rows = [prefill_features(shape, p.a, p.b, align=align) for p in points]
    if not attention:
        rows = [(one, t, b, 0.0) for one, t, b, _ in rows]
    checkpoints = _unit(shape, align).checkpoints_seconds  # measured apart: out of every point first
    seconds = [max(p.seconds - checkpoints(p.a + p.b, p.b), 0.0) for p in points]
    request_s, token_s, batch_s, context_s = nnls(rows, seconds)
    if token_s == 0 and batch_s == 0 and attention:
        request_s, token_s, batch_s, context_s = nnls([(one, t, b, 0.0) for one, t, b, _ in rows], seconds)
    if token_s == 0 and batch_s == 0:
        raise ProfileSchemaError("the prefill points fit no positive rate: measure longer prompts")
    return PrefillModel(
        token_s=token_s,
        batch_s=batch_s,
        batch_min=shape.batch_min,
        ubatch=shape.ubatch,
        batch=shape.batch,
        context_s=context_s,
        checkpoint_splits=shape.checkpoint_splits,
        request_s=request_s,
        checkpoint_s=shape.checkpoint_s,
    )


def fit_decode(points: Sequence[Point]) -> DecodeModel:
    """``step_s``, ``seq_s`` and ``context_s`` fitted to ``points`` (``batch``, ``context``, ``seconds``)."""
    rows = [(1.0, float(p.a - 1), p.b / 1000) for p in points]
    step_s, seq_s, context_s = nnls(rows, [p.seconds for p in points])[:3]
    if step_s <= 0:  # every point a batch of one at a long context: keep the smallest step seen
        step_s = min(p.seconds for p in points)
    return DecodeModel(step_s=step_s, seq_s=seq_s, context_s=context_s)


def nnls(rows: Sequence[Sequence[float]], seconds: Sequence[float]) -> list[float]:
    """Non-negative ``x`` minimising ``sum(((row . x) - s) / s) ** 2)`` (every row as long)."""
    if not rows or len(rows) != len(seconds):
        raise ProfileSchemaError("a fit needs at least one measured point")
    width = len(rows[0])
    weighted = [([f / s for f in row], 1.0) for row, s in zip(rows, seconds, strict=True) if s > 0]
    best: tuple[float, list[float]] = (float("inf"), [0.0] * width)
    for size in range(1, width + 1):
        for active in itertools.combinations(range(width), size):
            solution = _solve(weighted, active)
            if solution is None or any(v < 0 for v in solution):
                continue
            x = [0.0] * width
            for index, value in zip(active, solution, strict=True):
                x[index] = value
            error = sum((sum(f * v for f, v in zip(row, x, strict=True)) - y) ** 2 for row, y in weighted)
            if error < best[0] - 1e-15:
                best = (error, x)
    return best[1]


def _solve(weighted: Sequence[tuple[Sequence[float], float]], active: Sequence[int]) -> list[float] | None:
    """Least squares over the ``active`` columns by the normal equations (Gauss-Jordan, pivoting)."""
    n = len(active)
    matrix = [[sum(row[i] * row[j] for row, _ in weighted) for j in active] for i in active]
    vector = [sum(row[i] * y for row, y in weighted) for i in active]
    scale = max((abs(matrix[i][i]) for i in range(n)), default=0.0)
    for col in range(n):
        pivot = max(range(col, n), key=lambda r: abs(matrix[r][col]))
        if abs(matrix[pivot][col]) <= 1e-10 * scale:  # collinear features: another subset fits
            return None
        matrix[col], matrix[pivot] = matrix[pivot], matrix[col]
        vector[col], vector[pivot] = vector[pivot], vector[col]
        for r in range(n):
            if r != col:
                factor = matrix[r][col] / matrix[col][col]
                matrix[r] = [a - factor * b for a, b in zip(matrix[r], matrix[col], strict=True)]
                vector[r] -= factor * vector[col]
    return [vector[i] / matrix[i][i] for i in range(n)]
