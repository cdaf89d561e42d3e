"""The replay's yardsticks: shared prefixes and new tokens, the TTFT lower bound, and the report keys
built on them (session completion, prefill amplification, the ``lower-bound`` entry)."""

from __future__ import annotations

import dataclasses
import math

import pytest
from hypothesis import given
from hypothesis import strategies as st

from backends.sim import SimConfig
from gateway.replay.generate import agent_trace
from gateway.replay.report import LOWER_BOUND, REPORT_KEYS, report
from gateway.replay.results import Result
from gateway.replay.synth import CHAT_HEAD, CHAT_TAIL, prompt_tokens, template_tokens, threaded
from gateway.replay.traces import TraceRequest
from gateway.replay.yardsticks import TEMPLATE_TOKENS, lower_bounds, new_tokens, shared_prefixes
from policies.types import Architecture

OVERHEAD = 0.0016
VLLM = SimConfig(kind="vllm", context_window=94000, architecture=Architecture.HYBRID, prefix_caching=False)
LLAMA = SimConfig(kind="llamacpp", context_window=65536, architecture=Architecture.HYBRID)


def req(tokens: int, ids: tuple[int, ...], t: float = 0.0, session: str | None = None) -> TraceRequest:
    return TraceRequest(t, session, "m", tokens, ids, 16)


TURNS = [req(1300, (1, 2, 3)), req(2000, (1, 2, 3, 4))]
"""A conversation of two turns (session-less: the second's ids start with all of the first's)."""
TURN_2 = 2022
"""The second turn's prompt as the engine sees it: 2,000 tokens of text, 22 of template."""


def engine_tokens(request: TraceRequest, block: int) -> list[tuple[int, int]]:
    """Token ``p`` of the prompt as (its block id, its offset): equal pairs are equal tokens."""
    return [(request.hash_ids[p // block], p % block) for p in range(request.input_tokens)]


def common_prefix(a: list[tuple[int, int]], b: list[tuple[int, int]]) -> int:
    n = 0
    for x, y in zip(a, b, strict=False):
        if x != y:
            break
        n += 1
    return n


class TestSharedPrefixes:
    def test_hand_made_trace_at_512(self) -> None:
        """Whole blocks, then the cut last block as far as both prompts reach (the most any earlier had)."""
        trace = [
            req(1300, (1, 2, 3)),  # first: nothing earlier
            req(2000, (1, 2, 3, 4)),  # extends it: 2 whole blocks + the 276 tokens of block 3 it had
            req(900, (1, 7)),  # only block 1 in common
            req(1536, (1, 2, 3)),  # block 3 whole: the second request had all of it
            req(700, (5, 6)),  # new: its block 6 has 188 tokens
            req(1200, (5, 6, 8)),  # block 6 whole, but the earlier prompt ended inside it
            req(300, (5,)),  # ends inside block 5: only its own 300 tokens
            req(800, (5, 9)),  # diverges after block 5
        ]
        assert shared_prefixes(trace) == [0, 1300, 512, 1536, 0, 700, 300, 512]
        assert new_tokens(trace) == [1300, 700, 388, 0, 700, 500, 0, 288]

    def test_small_blocks(self) -> None:
        """The ``block`` parameter sets the block size (4 tokens here)."""
        trace = [req(6, (1, 2)), req(11, (1, 2, 3)), req(5, (1, 9)), req(3, (1,))]
        assert shared_prefixes(trace, block=4) == [0, 6, 4, 3]
        assert new_tokens(trace, block=4) == [6, 5, 1, 0]

    def test_agent_turns_share_the_previous_turn_and_agents_the_system_blocks(self) -> None:
        """A generated agent trace: turn k shares turn k-1's whole prompt; a new agent the 4 system blocks."""
        trace = agent_trace(agents=2, turns=3, max_context=6000, seed=3)
        shared = shared_prefixes(trace)
        previous: dict[str, int] = {}
        expected = []
        for request in trace:
            assert request.session is not None
            expected.append(previous.get(request.session, 2048 if previous else 0))
            previous[request.session] = request.input_tokens
        assert shared == expected

    @given(
        prompts=st.lists(
            st.tuples(st.lists(st.integers(0, 3), min_size=1, max_size=4), st.integers(1, 4)),
            min_size=1,
            max_size=8,
        )
    )
    def test_shared_is_the_longest_common_token_prefix_and_new_tokens_sum_to_the_distinct(
        self, prompts: list[tuple[list[int], int]]
    ) -> None:
        """By brute force over tokens (block 4): shared = the longest common prefix with any earlier
        prompt, and the new tokens add up to the trace's distinct tokens (a token trie's size)."""
        block = 4
        trace = [req(block * (len(ids) - 1) + cut, tuple(ids)) for ids, cut in prompts]
        tokens = [engine_tokens(r, block) for r in trace]
        expected = [max((common_prefix(t, e) for e in tokens[:i]), default=0) for i, t in enumerate(tokens)]
        assert shared_prefixes(trace, block) == expected
        trie = {
            (tuple(r.hash_ids[: p // block + 1]), p % block) for r in trace for p in range(r.input_tokens)
        }
        assert sum(new_tokens(trace, block)) == len(trie)


class TestLowerBounds:
    def test_template_accounting(self) -> None:
        """The engine sees the chat head (3 tokens) + the prompt + the tail (7): 10 template tokens."""
        assert (len(CHAT_HEAD), len(CHAT_TAIL), TEMPLATE_TOKENS) == (3, 7, 10)
        assert len(prompt_tokens(req(1300, (1, 2, 3)))) == 1300 + TEMPLATE_TOKENS

    def test_a_later_turn_is_three_messages(self) -> None:
        """Turn 2 goes on from turn 1 (``synth.threaded``): user, assistant (turn 1's 16-token answer),
        user: heads of 3 + 5 + 3 tokens, three closes of 2 and the generation prompt's 5."""
        assert template_tokens(threaded(TURNS)[1]) == TURN_2 - 2000 == 22

    def test_first_turn_on_vllm_second_from_llama_reuse(self) -> None:
        """Turn 1 (nothing shared) is fastest on vLLM; turn 2 reuses turn 1 and the template before
        its last message on llama.cpp."""
        bounds = lower_bounds(TURNS, {"vllm": VLLM, "llama": LLAMA}, OVERHEAD)
        # turn 1: vLLM 1310 / 6600 = 0.198 s beats llama (1310 - 3) / 3000 = 0.436 s
        # turn 2: vLLM 2022 / 6600 = 0.306 s; llama (2022 - 1300 - 15) / 3000 = 0.236 s
        assert bounds == [pytest.approx(1310 / 6600 + OVERHEAD), pytest.approx(707 / 3000 + OVERHEAD)]

    def test_each_engine_alone(self) -> None:
        """Without the other engine, each engine's own formula gives the bound."""
        trace = TURNS
        assert lower_bounds(trace, {"vllm": VLLM}, 0.0) == [
            pytest.approx(1310 / 6600),
            pytest.approx(TURN_2 / 6600),
        ]
        assert lower_bounds(trace, {"llama": LLAMA}, 0.0) == [
            pytest.approx(1307 / 3000),
            pytest.approx(707 / 3000),
        ]

    def test_vllm_prefix_caching_floors_reuse_to_whole_blocks(self) -> None:
        """Hybrid: (1300 + 15) // 256 * 256 = 1280 reused; dense: 16-token blocks, 1312 reused."""
        trace = TURNS
        hybrid = SimConfig(
            kind="vllm", context_window=94000, architecture=Architecture.HYBRID, block_size=256
        )
        dense = SimConfig(kind="vllm", context_window=94000, architecture=Architecture.DENSE)
        assert lower_bounds(trace, {"v": hybrid}, 0.0) == [
            pytest.approx(1310 / 6600),
            pytest.approx((TURN_2 - 1280) / 6600),
        ]
        assert lower_bounds(trace, {"v": dense}, 0.0) == [
            pytest.approx(1310 / 6600),
            pytest.approx((TURN_2 - 1312) / 6600),
        ]

    def test_an_exact_repeat_may_reuse_all_but_one_token(self) -> None:
        """A prompt an earlier one had all of (template and all) may reuse P - 1 tokens on llama.cpp
        and whole blocks of P - 1 on vLLM with prefix caching: the bound never exceeds what the
        engines do with a repeat (a simulator computed 1 token on llama, 5 on vLLM)."""
        trace = [req(1275, (1, 2, 3)), req(1275, (1, 2, 3))]
        hybrid = SimConfig(
            kind="vllm", context_window=94000, architecture=Architecture.HYBRID, block_size=256
        )
        assert lower_bounds(trace, {"llama": LLAMA}, 0.0)[1] == pytest.approx(1 / 3000)
        assert lower_bounds(trace, {"v": hybrid}, 0.0)[1] == pytest.approx((1285 - 1280) / 6600)

    def test_windows(self) -> None:
        """vLLM needs prompt < window, llama.cpp prompt <= window; a prompt that fits none has no bound."""
        trace = [
            req(93990, (1,)),  # 94,000 with the template: vLLM refuses it, llama's window is smaller
            req(93989, (2,)),  # 93,999: fits vLLM
            req(65526, (3,)),  # 65,536: fits llama exactly
            req(65527, (4,)),  # 65,537: too long for llama
        ]
        assert lower_bounds(trace, {"vllm": VLLM, "llama": LLAMA}, OVERHEAD) == [
            None,
            pytest.approx(93999 / 6600 + OVERHEAD),
            pytest.approx(65536 / 6600 + OVERHEAD),  # vLLM still wins: 9.9 s < 21.8 s
            pytest.approx(65537 / 6600 + OVERHEAD),
        ]
        assert lower_bounds(trace, {"llama": LLAMA}, 0.0) == [
            None,
            None,
            pytest.approx((65536 - 3) / 3000),
            None,
        ]


def result(
    index: int,
    arrival: float,
    start: float,
    ttft: float | None,
    completion: float,
    prompt: int,
    cached: int,
    backend: str,
    error: str | None = None,
) -> Result:
    return Result(index, None, arrival, start, backend, ttft, completion, prompt, cached, 50, error)


class TestReport:
    TRACE = (
        req(1000, (1, 2), 0.0, "s"),
        req(400, (9,), 1.0),
        req(300, (20,), 2.0, "u"),
        req(700, (20, 21), 3.0, "u"),
        req(200, (30,), 4.0, "v"),
        req(1400, (1, 2, 3), 5.0, "s"),
        req(600, (30, 31), 6.0, "v"),
        req(900, (9, 10), 7.0),  # no session: the next turn of request 1 (its ids extend 1's)
    )
    # new tokens: 1000, 400, 300, 400, 200, 400, 400, 500
    RESULTS = (
        result(0, 0.0, 0.0, 0.5, 2.0, 1010, 0, "llama"),
        result(1, 1.0, 1.0, 0.2, 1.5, 410, 0, "vllm"),
        result(2, 2.0, 2.0, 0.1, 1.0, 310, 0, "llama"),
        result(3, 3.0, 3.2, 0.2, 0.8, 710, 303, "llama"),
        result(4, 4.0, 4.0, 0.1, 0.5, 210, 0, "vllm"),
        result(5, 5.0, 5.5, 0.3, 3.0, 1410, 1003, "llama"),
        result(6, 6.0, 6.0, None, 0.2, 0, 0, "vllm", error="boom"),
        result(7, 7.0, 7.0, 0.4, 1.0, 910, 403, "llama"),
    )

    def test_session_completion_and_prefill_amplification(self) -> None:
        """Sessions: conversations of 2+ turns all completed, last end - first start; amplification:
        prefilled tokens / new tokens of the completed requests."""
        out = report({"cost": self.RESULTS}, {"x": 1}, self.TRACE, 512)
        entry = out["profiles"]["cost"]
        assert out["meta"] == {"x": 1}
        assert tuple(entry) == REPORT_KEYS
        assert (entry["requests"], entry["errors"]) == (7, 1)
        # s: 8.5 - 0 = 8.5; the session-less pair 1 -> 7: 8.0 - 1.0 = 7.0; u: 4.0 - 2.0 = 2.0;
        # v is left out (its second turn failed)
        assert entry["session_completion_mean_s"] == round((8.5 + 7.0 + 2.0) / 3, 4)
        # (1010 + 410 + 310 + 407 + 210 + 407 + 507) / (the chat head once + each new prompt with the tail:
        # 3 + (1000 + 400 + 300 + 400 + 200 + 400 + 500) + 7 * 7)
        assert entry["prefill_amplification"] == round(3261 / 3252, 4)
        assert entry["cache_hit_ratio"] == round(1709 / 4970, 4)
        assert entry["backend_share"] == {"llama": round(5 / 7, 4), "vllm": round(2 / 7, 4)}
        # of those three, only the pair 1 -> 7 changed backend (vllm, then llama)
        assert entry["sessions_moved"] == round(1 / 3, 4)

    def test_each_request_is_judged_on_what_its_client_waits_for(self) -> None:
        """``awaited_*``: an agent's call by its last token, any other request by its first; without
        agents it is the TTFT, with agents alone the time to the last token."""
        agents = [i in (0, 5) for i in range(len(self.TRACE))]  # the session s turns are an agent's
        trace = [dataclasses.replace(r, agent=a) for r, a in zip(self.TRACE, agents, strict=True)]
        entry = report({"cost": self.RESULTS}, None, trace, 512)["profiles"]["cost"]
        # done: 0 (agent: 2.0), 1 (0.2), 2 (0.1), 3 (0.2), 4 (0.1), 5 (agent: 3.0), 7 (0.4)
        assert entry["awaited_mean_s"] == round((2.0 + 0.2 + 0.1 + 0.2 + 0.1 + 3.0 + 0.4) / 7, 4)
        assert entry["awaited_p90_s"] == 3.0  # the 7th of 7
        assert entry["ttft_mean_s"] == round((0.5 + 0.2 + 0.1 + 0.2 + 0.1 + 0.3 + 0.4) / 7, 4)
        chat = report({"cost": self.RESULTS}, None, self.TRACE, 512)["profiles"]["cost"]
        assert (chat["awaited_mean_s"], chat["awaited_p90_s"]) == (chat["ttft_mean_s"], chat["ttft_p90_s"])
        only = [dataclasses.replace(r, agent=True) for r in self.TRACE]
        agents_only = report({"cost": self.RESULTS}, None, only, 512)["profiles"]["cost"]
        assert agents_only["awaited_mean_s"] == agents_only["completion_mean_s"]
        assert agents_only["awaited_p90_s"] == agents_only["completion_p90_s"]

    def test_without_the_trace_the_trace_keys_are_null(self) -> None:
        """No trace: no conversations and no new tokens to divide by."""
        entry = report({"cost": self.RESULTS})["profiles"]["cost"]
        assert (entry["session_completion_mean_s"], entry["prefill_amplification"]) == (None, None)
        assert entry["sessions_moved"] is None

    def test_lower_bound_entry(self) -> None:
        """The ``lower-bound`` entry has every report key: its TTFT keys from the bounds, the rest null."""
        bounds = [0.2, 0.1, 0.05, 0.3, None, 0.4, 0.6, 0.15]
        out = report({"cost": self.RESULTS}, None, self.TRACE, 512, bounds)
        assert list(out["profiles"]) == ["cost", LOWER_BOUND]
        entry = out["profiles"][LOWER_BOUND]
        assert tuple(entry) == REPORT_KEYS
        assert entry == {
            "requests": 7,
            "errors": 1,
            "ttft_mean_s": round(1.8 / 7, 4),
            "ttft_p50_s": 0.2,  # the 4th of 7
            "ttft_p90_s": 0.6,  # the 7th of 7
            "ttft_mean_long_s": None,  # no prompt of 30k tokens
            "completion_mean_s": None,
            "completion_p90_s": None,
            "awaited_mean_s": None,
            "awaited_p90_s": None,
            "throughput_tok_s": None,
            "cache_hit_ratio": None,
            "backend_share": {},
            "session_completion_mean_s": None,
            "prefill_amplification": None,
            "sessions_moved": None,
        }

    def test_lower_bound_long_prompts(self) -> None:
        """``ttft_mean_long_s`` of the bound: the bounds of the prompts of 30,000 tokens or more."""
        trace = [req(30000, (1,)), req(29999, (2,)), req(40000, (3,))]
        out = report({}, None, trace, 512, [2.0, 1.0, 5.0])
        assert out["profiles"][LOWER_BOUND]["ttft_mean_long_s"] == 3.5
        assert math.isclose(out["profiles"][LOWER_BOUND]["ttft_mean_s"], 8.0 / 3, abs_tol=1e-4)
