"""The validation set's generated traffic keeps the published shapes it was built from
(``gateway.replay.generate_public``): Copilot's turns a session, calls a turn, cached share and answer
length; BurstGPT's bursts (gaps more variable than a Poisson's)."""

from __future__ import annotations

import itertools
import statistics
from collections import defaultdict

import pytest

from gateway.replay.generate_public import (
    CALLS_MEAN,
    COMPLETION_MEAN,
    NEW_SHARE,
    TURNS_MEAN,
    burst_trace,
    copilot_burst_trace,
    copilot_trace,
)
from gateway.replay.traces import BLOCK_TOKENS


def test_copilot_sessions_have_the_published_turns_calls_and_answers() -> None:
    calls = [r for seed in range(60) for r in copilot_trace(sessions=4, seed=seed)]
    sessions: dict[str, list[int]] = defaultdict(list)
    for r in calls:
        assert r.session is not None
        sessions[r.session].append(r.input_tokens)
    per_session = statistics.mean(len(v) for v in sessions.values())
    assert per_session == pytest.approx(TURNS_MEAN * CALLS_MEAN, rel=0.25)  # ~30.9
    assert statistics.mean(r.max_tokens for r in calls) == pytest.approx(COMPLETION_MEAN, rel=0.15)


def test_a_copilot_call_resends_about_86_percent_of_its_prompt() -> None:
    """The blocks a call shares with the session's previous call, over its prompt (compactions and
    first calls included, as the traces' cached share counts them)."""
    shares = []
    for seed in range(30):
        last: dict[str, tuple[int, ...]] = {}
        for r in copilot_trace(sessions=4, seed=seed):
            assert r.session is not None
            before = last.get(r.session, ())
            same = next((i for i, (a, b) in enumerate(zip(before, r.hash_ids, strict=False)) if a != b), None)
            shared = min(len(before), len(r.hash_ids)) if same is None else same
            shares.append(min(shared * BLOCK_TOKENS, r.input_tokens) / r.input_tokens)
            last[r.session] = r.hash_ids
    assert statistics.mean(shares) == pytest.approx(1 - NEW_SHARE, abs=0.02)


def test_burst_arrivals_are_burstier_than_poisson() -> None:
    trace = burst_trace(requests=2000, seed=1, per_s=3.0)
    gaps = [b.t - a.t for a, b in itertools.pairwise(trace)]
    assert statistics.mean(gaps) == pytest.approx(1 / 3, rel=0.2)
    assert statistics.stdev(gaps) / statistics.mean(gaps) > 1.5  # a Poisson process's is 1
    assert all(r.session is None for r in trace)


def test_merged_traces_share_no_block_ids() -> None:
    trace = copilot_burst_trace(seed=3)
    agents = {i for r in trace if r.session is not None for i in r.hash_ids}
    chat = {i for r in trace if r.session is None for i in r.hash_ids}
    assert agents
    assert chat
    assert not agents & chat
