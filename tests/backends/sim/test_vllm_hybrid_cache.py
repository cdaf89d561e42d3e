"""The simulated vLLM serving a hybrid model as vLLM 0.25 does (issue #61): prompts reused in whole
blocks of what the previous turn computed, the block taken from the engine profile, prefill steps cut
to whole blocks, and vLLM 0.24 (``prefix_caching = "off"``) reusing nothing.

The turns are the ones measured on one H100 (``bench/gpu/results/2026-12-06c-h100-vllm/
turns-vllm-fp8.json``: vLLM 0.25, the 27B's shape, fp8 KV cache, 1,568-token blocks): three agent
sessions of four turns, each answer 128 tokens, growing by ~300, ~1,500 and ~5,000 words a turn.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from backends.clock import Events
from backends.engine_profiles import load_profile
from backends.sim.config import SimConfig
from backends.sim.drive import EventDriver
from backends.sim.generation import Answer, DeltaKind, OutToken
from backends.sim.task import SimTask
from backends.sim.vllm_engine import VllmEngine
from policies.types import Architecture

MEASURED = Path(__file__).resolve().parents[3] / "bench/gpu/results/2026-12-06c-h100-vllm/turns-vllm-fp8.json"
ANSWER = 128


def measured_sessions() -> dict[int, list[tuple[int, int]]]:
    """Per growth: each turn's (prompt tokens, cached tokens) as vLLM reported them."""
    rows = json.loads(MEASURED.read_text())["rows"]
    sessions: dict[int, list[tuple[int, int]]] = {}
    for row in rows:
        if row["kind"] == "turn":
            assert row["completion_tokens"] == ANSWER
            sessions.setdefault(row["grow"], []).append((row["prompt_tokens"], row["cached_tokens"]))
    return sessions


class Session:
    """One conversation on a simulated vLLM in virtual time: each turn resends the conversation (the
    previous prompt and its whole answer) and adds new tokens, as an agent does."""

    def __init__(self, config: SimConfig) -> None:
        self.events = Events()
        self.engine = VllmEngine(config, clock=self.events.clock)
        self.driver = EventDriver(self.engine, self.events)
        self.conversation: list[int] = []
        self.fresh = 10_000_000  # token ids no other turn uses

    def turn(self, prompt_tokens: int, answer: int = ANSWER) -> SimTask:
        new = prompt_tokens - len(self.conversation)
        assert new > 0
        prompt = self.conversation + list(range(self.fresh, self.fresh + new))
        self.fresh += new
        tokens = tuple(OutToken(self.fresh + i, "w", DeltaKind.TEXT) for i in range(answer))
        self.fresh += answer
        task = SimTask(
            f"t{len(self.conversation)}", prompt, Answer(tokens, "length", None), listener=lambda _: None
        )
        self.engine.submit(task)
        self.events.run()
        assert task.finished
        self.conversation = prompt + [t.id for t in tokens]
        return task


def hybrid(profile: str) -> SimConfig:
    return SimConfig(
        kind="vllm", architecture=Architecture.HYBRID, context_window=65536, profile=load_profile(profile)
    )


@pytest.mark.parametrize("grow", [300, 1500, 5000])
def test_every_measured_turn_reuses_exactly_what_vllm_did(grow: int) -> None:
    """The H100's cached tokens of every turn, from the profile's 1,568-token block: whole blocks of
    the previous prompt and its answer but the answer's last token (never fed back)."""
    measured = measured_sessions()[grow]
    session = Session(hybrid("h100-vllm-27b-shape-fp8"))
    got = [(len(task.prompt), task.cached) for task in (session.turn(p) for p, _ in measured)]
    assert got == measured
    previous = [p for p, _ in measured[:-1]]
    assert [c for _, c in measured[1:]] == [(p + ANSWER - 1) // 1568 * 1568 for p in previous]


def test_the_answers_last_token_is_not_cached() -> None:
    """A conversation that ends exactly on a block boundary with its answer: vLLM computed one token
    less, so the last block is not there (784-token blocks: vLLM 0.25's with a bf16 KV cache)."""
    config = SimConfig(kind="vllm", architecture=Architecture.HYBRID, context_window=65536, block_size=784)
    session = Session(config)
    session.turn(2 * 784 - ANSWER)  # prompt + answer = 1,568 tokens: 1,567 computed
    assert session.turn(3000).cached == 784


def test_the_block_comes_from_the_profile_and_an_explicit_one_wins() -> None:
    assert hybrid("h100-vllm-27b-shape-fp8").cache_block_size == 1568
    assert SimConfig(kind="vllm", architecture=Architecture.HYBRID).cache_block_size == 256
    explicit = SimConfig(kind="vllm", block_size=784, profile=load_profile("h100-vllm-27b-shape-fp8"))
    assert explicit.cache_block_size == 784


def test_vllm_024_reuses_nothing_of_a_hybrid_model() -> None:
    """``seed-5090-vllm-0.24-27b`` says ``prefix_caching = "off"``: every turn prefills it all."""
    config = hybrid("seed-5090-vllm-0.24-27b")
    assert not config.prefix_caching
    session = Session(config)
    assert [session.turn(p).cached for p in (2000, 4000, 6000)] == [0, 0, 0]
    on = Session(hybrid("seed-5090-vllm-27b"))
    assert [on.turn(p).cached for p in (2000, 4000, 6000)] == [0, 1568, 3136]


def test_prefill_steps_are_cut_to_whole_blocks() -> None:
    """vLLM 0.25's align mode: with 2,048 tokens a step and 1,568-token blocks a 4,000-token prompt
    runs in steps of 1,568, 1,568 and the 864 past the last whole block (vLLM 0.24: 2,048 and 1,952)."""
    session = Session(hybrid("seed-5090-vllm-27b"))
    session.turn(4000, answer=1)
    assert session.driver.steps == 3
    old = Session(hybrid("seed-5090-vllm-0.24-27b"))
    old.turn(4000, answer=1)
    assert old.driver.steps == 2
    profile = load_profile("seed-5090-vllm-27b")
    assert list(profile.prefill_steps(4000)) == [(1568, 0), (1568, 1568), (864, 3136)]
    assert list(profile.prefill_steps(2500, cached=1568)) == [(1568, 1568), (932, 3136)]
    assert list(load_profile("seed-5090-vllm-0.24-27b").prefill_steps(4000)) == [(2048, 0), (1952, 2048)]


def test_a_hybrid_model_gets_no_more_sequences_than_its_pool_has_blocks() -> None:
    """vLLM 0.25 refuses to start a hybrid model with more sequences than blocks (one recurrent
    state each; measured: "max_num_seqs (1024) exceeds available Mamba cache blocks (267)"); the
    simulator too, and its default stays under the limit (3 windows of 32,768 tokens hold 62
    blocks of 1,568)."""
    profile = load_profile("seed-5090-vllm-27b")
    config = SimConfig(kind="vllm", architecture=Architecture.HYBRID, context_window=32768, profile=profile)
    assert (config.kv_pool_tokens // 1568, config.max_num_seqs) == (62, 62)
    with pytest.raises(ValueError, match=r"max_num_seqs \(64\) exceeds available Mamba cache blocks \(62\)"):
        SimConfig(
            kind="vllm",
            architecture=Architecture.HYBRID,
            context_window=32768,
            profile=profile,
            max_num_seqs=64,
        )
    dense = SimConfig(kind="vllm", architecture=Architecture.DENSE, context_window=32768, profile=profile)
    assert dense.max_num_seqs == 256  # no recurrent state: vLLM's own limit only
