"""Summaries of replay results: one row of numbers per profile (and the oracle), a table, JSON.

Per profile, over the requests that completed (``requests``; failed or unfinished ones are ``errors``),
in simulated seconds:

* ``ttft_mean_s``, ``ttft_p50_s``, ``ttft_p90_s``: time to first token from when the request was sent
  (percentiles by the nearest-rank rule: the ``ceil(q * n)``-th smallest);
* ``ttft_mean_long_s``: mean TTFT of the requests whose prompt has at least ``LONG_PROMPT_TOKENS``
  tokens (null when there are none);
* ``completion_mean_s``, ``completion_p90_s``: mean and 90th percentile of the time from sending to
  the last token (what an agent waits for: ``policies.awaited``);
* ``awaited_mean_s``, ``awaited_p90_s``: the same over what each request's client waits for: the last
  token of an agent's call (``TraceRequest.agent``), the first token of any other request (without
  the trace: the first token of every request). A row of agents alone has its completion here, a row
  of chat its TTFT, and a mixed row each request by its own clock;
* ``throughput_tok_s``: generated tokens / (last completion - first arrival);
* ``cache_hit_ratio``: sum of cached prompt tokens / sum of prompt tokens;
* ``backend_share``: backend -> fraction of the completed requests it served;
* ``session_completion_mean_s``: over the conversations of two or more turns that all completed,
  mean time from sending the first turn to the last answer (null when there are none);
* ``prefill_amplification``: tokens the engines prefilled (prompt - cached) / the distinct tokens of
  the same requests' prompts, chat template included (``yardsticks.distinct_tokens``);
* ``sessions_moved``: of those conversations, the share answered by more than one backend (for a
  model group over one backend per member: the conversations that changed model).

A pooled report (:func:`pooled_report`) counts every request of several draws of one workload once:
the same keys, over all of them.

The report's ``lower-bound`` entry (``yardsticks.lower_bounds``) has the TTFT keys only: no routing
can beat them.
"""

from __future__ import annotations

import itertools
import math
import statistics
from collections import Counter
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, replace
from typing import Any

from gateway.replay.results import Result
from gateway.replay.traces import TraceRequest, conversations
from gateway.replay.yardsticks import distinct_tokens, new_tokens

LOWER_BOUND = "lower-bound"
LONG_PROMPT_TOKENS = 30_000
REPORT_KEYS = (
    "requests",
    "errors",
    "ttft_mean_s",
    "ttft_p50_s",
    "ttft_p90_s",
    "ttft_mean_long_s",
    "completion_mean_s",
    "completion_p90_s",
    "awaited_mean_s",
    "awaited_p90_s",
    "throughput_tok_s",
    "cache_hit_ratio",
    "backend_share",
    "session_completion_mean_s",
    "prefill_amplification",
    "sessions_moved",
)
"""The keys of every profile's entry, in order (the JSON report and the table use them)."""


def percentile(values: Sequence[float], q: float) -> float | None:
    """Nearest-rank percentile: the ``ceil(q * n)``-th smallest value (None for no values)."""
    if not values:
        return None
    ordered = sorted(values)
    rank = min(max(math.ceil(q * len(ordered)), 1), len(ordered))
    return ordered[rank - 1]


def _mean(values: Sequence[float]) -> float | None:
    return sum(values) / len(values) if values else None


def _round(value: float | None, digits: int = 4) -> float | None:
    return None if value is None else round(value, digits)


def summarize(
    results: Sequence[Result],
    groups: Sequence[Sequence[int]] = (),
    distinct: Sequence[int] | None = None,
    draws: Sequence[range] = (),
    agents: Sequence[bool] | None = None,
) -> dict[str, Any]:
    """The report entry of one profile (keys: :data:`REPORT_KEYS`, formulas: module docstring);
    ``groups``: the trace's conversations (indices), ``distinct``: each request's new tokens;
    ``draws``: the request indices of each draw of a pooled report (:func:`pooled_report`), whose
    spans and distinct tokens add up (none: one draw); ``agents``: whether each request (by index) is
    an agent's call, which waits for its last token."""
    done = [r for r in results if r.ok]
    ttfts = [r.ttft_s for r in done if r.ttft_s is not None]
    awaited = [awaited_s(r, agents) for r in done]
    long = [r.ttft_s for r in done if r.ttft_s is not None and r.prompt_tokens >= LONG_PROMPT_TOKENS]
    prompt = sum(r.prompt_tokens for r in done)
    parts = [[r for r in done if r.index in draw] for draw in draws] if draws else [done]
    span = sum(max(r.end_s for r in part) - min(r.arrival_s for r in part) for part in parts if part)
    backends = Counter(r.backend or "?" for r in done)
    by_index = {r.index: r for r in results}
    finished = [g for g in groups if len(g) > 1 and all(i in by_index and by_index[i].ok for i in g)]
    sessions = [max(by_index[i].end_s for i in g) - by_index[g[0]].start_s for g in finished]
    moved = [len({by_index[i].backend for i in g}) > 1 for g in finished]
    new = (
        sum(distinct_tokens([distinct[r.index] for r in part]) for part in parts)
        if distinct is not None
        else 0
    )
    prefilled = sum(r.prompt_tokens - r.cached_tokens for r in done)
    return {
        "requests": len(done),
        "errors": len(results) - len(done),
        "ttft_mean_s": _round(_mean(ttfts)),
        "ttft_p50_s": _round(percentile(ttfts, 0.5)),
        "ttft_p90_s": _round(percentile(ttfts, 0.9)),
        "ttft_mean_long_s": _round(_mean(long)),
        "completion_mean_s": _round(_mean([r.completion_s for r in done])),
        "completion_p90_s": _round(percentile([r.completion_s for r in done], 0.9)),
        "awaited_mean_s": _round(_mean(awaited)),
        "awaited_p90_s": _round(percentile(awaited, 0.9)),
        "throughput_tok_s": _round(sum(r.completion_tokens for r in done) / span if span > 0 else None, 2),
        "cache_hit_ratio": _round(sum(r.cached_tokens for r in done) / prompt if prompt else None),
        "backend_share": {b: round(n / len(done), 4) for b, n in sorted(backends.items())},
        "session_completion_mean_s": _round(_mean(sessions)),
        "prefill_amplification": _round(prefilled / new if new else None),
        "sessions_moved": _round(sum(moved) / len(moved) if moved else None),
    }


def awaited_s(result: Result, agents: Sequence[bool] | None) -> float:
    """What the client of a completed request waited for: its last token if it is an agent's call
    (``agents[result.index]``), else its first."""
    if agents is not None and agents[result.index]:
        return result.completion_s
    assert result.ttft_s is not None  # a completed request has its first token
    return result.ttft_s


def bound_summary(requests: Sequence[TraceRequest], bounds: Sequence[float | None]) -> dict[str, Any]:
    """The ``lower-bound`` entry: TTFT mean and percentiles of the per-request bounds (the requests
    that fit some engine); every other key null."""
    values = [b for b in bounds if b is not None]
    long = [
        b
        for r, b in zip(requests, bounds, strict=True)
        if b is not None and r.input_tokens >= LONG_PROMPT_TOKENS
    ]
    out: dict[str, Any] = dict.fromkeys(REPORT_KEYS)
    out |= {
        "requests": len(values),
        "errors": len(bounds) - len(values),
        "ttft_mean_s": _round(_mean(values)),
        "ttft_p50_s": _round(percentile(values, 0.5)),
        "ttft_p90_s": _round(percentile(values, 0.9)),
        "ttft_mean_long_s": _round(_mean(long)),
        "backend_share": {},
    }
    return out


def report(
    runs: Mapping[str, Sequence[Result]],
    meta: Mapping[str, Any] | None = None,
    trace: Sequence[TraceRequest] | None = None,
    block: int = 512,
    bounds: Sequence[float | None] | None = None,
) -> dict[str, Any]:
    """The JSON report: ``{"meta": {...}, "profiles": {name: summary}}`` (the oracle is ``oracle``,
    the lower bound, given ``bounds``, ``lower-bound``); with the ``trace``, the conversation and
    amplification keys are filled."""
    groups = conversations(trace) if trace is not None else []
    distinct = new_tokens(trace, block) if trace is not None else None
    agents = [r.agent for r in trace] if trace is not None else None
    profiles = {name: summarize(rs, groups, distinct, agents=agents) for name, rs in runs.items()}
    if bounds is not None and trace is not None:
        profiles[LOWER_BOUND] = bound_summary(trace, bounds)
    return {"meta": dict(meta or {}), "profiles": profiles}


@dataclass(frozen=True)
class Draw:
    """One replay of one draw of a generated workload: its results per profile, its trace and its
    lower bounds (``simulate``'s ``runs`` and ``bounds``)."""

    runs: Mapping[str, Sequence[Result]]
    trace: Sequence[TraceRequest]
    bounds: Sequence[float | None]


def pooled_report(
    draws: Sequence[Draw], meta: Mapping[str, Any] | None = None, block: int = 512
) -> dict[str, Any]:
    """Several draws of one workload (the same generator, other seeds) as one :func:`report`: every
    request of every draw counts once, so a mean is over all of them and a percentile over their
    union; the draws' spans add up for the throughput, their distinct tokens for the amplification,
    and each draw's conversations stay its own. Near saturation one draw of a workload says little
    about a policy (docs/replay.md, "Draws"): pooled, the noise of one draw shrinks with their count."""
    offsets = list(itertools.accumulate((len(d.trace) for d in draws), initial=0))[:-1]
    ranges = [range(start, start + len(d.trace)) for start, d in zip(offsets, draws, strict=True)]
    groups = [
        [start + i for i in group]
        for start, d in zip(offsets, draws, strict=True)
        for group in conversations(d.trace)
    ]
    distinct = [n for d in draws for n in new_tokens(d.trace, block)]
    trace = [r for d in draws for r in d.trace]
    agents = [r.agent for r in trace]
    profiles = {
        name: summarize(
            [
                replace(r, index=start + r.index)
                for start, d in zip(offsets, draws, strict=True)
                for r in d.runs[name]
            ],
            groups,
            distinct,
            ranges,
            agents,
        )
        for name in draws[0].runs
    }
    profiles[LOWER_BOUND] = bound_summary(trace, [b for d in draws for b in d.bounds])
    return {"meta": dict(meta or {}), "profiles": profiles}


def median_report(
    reports: Sequence[Mapping[str, Any]], meta: Mapping[str, Any] | None = None
) -> dict[str, Any]:
    """Several :func:`report` s of the same replay as one: every number is its median over the runs
    (per backend for ``backend_share``; a value missing from a run counts as missing, not zero),
    except ``errors``: the most any run had."""
    profiles: dict[str, Any] = {}
    for name in reports[0]["profiles"]:
        entries = [r["profiles"][name] for r in reports]
        merged: dict[str, Any] = {}
        for key in REPORT_KEYS:
            values = [e.get(key) for e in entries]
            if key == "errors":
                merged[key] = max(v or 0 for v in values)  # an error in any run stays visible
            elif key == "backend_share":
                backends = sorted({b for v in values for b in v})
                merged[key] = {b: _median([v.get(b, 0.0) for v in values]) for b in backends}
            else:
                merged[key] = _median(values)
        profiles[name] = merged
    return {"meta": dict(meta or {}), "profiles": profiles}


def _median(values: Sequence[Any]) -> Any:
    present = [v for v in values if v is not None]
    if not present:
        return None
    middle = statistics.median(present)
    return round(middle) if all(isinstance(v, int) for v in present) else _round(float(middle))


def _cell(value: Any) -> str:
    if value is None:
        return "-"
    if isinstance(value, dict):
        return " ".join(f"{k}:{v:.0%}" for k, v in value.items()) or "-"
    if isinstance(value, float):
        return f"{value:.3f}" if abs(value) < 100 else f"{value:.1f}"
    return str(value)


TABLE_COLUMNS = (
    ("profile", None),
    ("n", "requests"),
    ("err", "errors"),
    ("ttft mean", "ttft_mean_s"),
    ("p50", "ttft_p50_s"),
    ("p90", "ttft_p90_s"),
    ("ttft>=30k", "ttft_mean_long_s"),
    ("last token", "completion_mean_s"),
    ("last p90", "completion_p90_s"),
    ("awaited", "awaited_mean_s"),
    ("awaited p90", "awaited_p90_s"),
    ("tok/s", "throughput_tok_s"),
    ("cache hit", "cache_hit_ratio"),
    ("session", "session_completion_mean_s"),
    ("prefill x", "prefill_amplification"),
    ("moved", "sessions_moved"),
    ("backends", "backend_share"),
)


def table(profiles: Mapping[str, Mapping[str, Any]]) -> str:
    """A Markdown table of the summaries (seconds are simulated)."""
    header = "| " + " | ".join(name for name, _ in TABLE_COLUMNS) + " |"
    rule = "|" + "|".join(" --- " for _ in TABLE_COLUMNS) + "|"
    rows = [
        "| " + " | ".join(name if key is None else _cell(summary.get(key)) for _, key in TABLE_COLUMNS) + " |"
        for name, summary in profiles.items()
    ]
    return "\n".join([header, rule, *rows])
