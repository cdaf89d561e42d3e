"""The other sessions' next turns an answer waits for (``policies.coming``): the chance each arrives
while it decodes, the prefill it costs, the llama-server's slots as the limit, the estimate's time
to the last token, and learning that takes the predicted stall out of a measured decode."""

from __future__ import annotations

import math
from types import MappingProxyType

import pytest
from hypothesis import given
from hypothesis import strategies as st
from msgspec.structs import replace

from policies import BUILTIN_PROFILES, RequestFeatures, route
from policies.awaited import TOOLS
from policies.coming import NextTurn, arrival_chance, stall_s
from policies.context import RoutingContext
from policies.cost import estimate
from policies.decision import Estimate, Outcome
from policies.learning import STALL_KEPT, LearnedState, learn
from policies.pricing import prefill_s
from policies.types import Awaited, EngineKind, SessionSource, Usage
from tests.policies.cost_helpers import (
    CODEX_500,
    LLAMA,
    VLLM,
    features,
    llama_snapshot,
    seed_snapshots,
    vllm_snapshot,
)


def test_a_turn_with_no_think_time_arrives_the_moment_it_is_ready() -> None:
    turn = NextTurn(ready_at=5.0, think_s=0.0, tokens=2000, cached=10_000)
    assert arrival_chance(turn, 4.0, 6.0) == 1.0
    assert arrival_chance(turn, 5.5, 9.0) == 0.0  # it came before the answer decoded
    assert arrival_chance(turn, 0.0, 4.0) == 0.0  # after the answer ended


def test_the_wait_is_exponential_from_when_it_is_ready() -> None:
    turn = NextTurn(ready_at=2.0, think_s=2.0, tokens=2000, cached=10_000)
    assert math.isclose(arrival_chance(turn, 3.0, 6.0), math.exp(-0.5) - math.exp(-2.0))
    assert math.isclose(arrival_chance(turn, 0.0, 4.0), 1.0 - math.exp(-1.0))  # from when it is ready
    # not memoryless: a session silent for five of its think times is unlikely to send at once
    assert arrival_chance(turn, 12.0, 14.0) < arrival_chance(turn, 2.0, 4.0) / 100


@given(
    st.floats(0.0, 20.0),
    st.floats(0.0, 10.0),
    st.floats(0.0, 20.0),
    st.floats(0.0, 20.0),
    st.floats(0.0, 20.0),
)
def test_the_chance_is_a_probability_and_grows_with_the_window(
    ready: float, think: float, start: float, length: float, more: float
) -> None:
    turn = NextTurn(ready_at=ready, think_s=think, tokens=100, cached=0)
    chance = arrival_chance(turn, start, start + length)
    longer = arrival_chance(turn, start, start + length + more)
    assert 0.0 <= chance <= longer <= 1.0 + 1e-12


def test_the_stall_is_the_expected_prefill_of_the_turns_that_come() -> None:
    learned = LearnedState()
    stats = learned.for_deployment(LLAMA, EngineKind.LLAMACPP)
    sure = NextTurn(ready_at=1.0, think_s=0.0, tokens=3000, cached=20_000)
    late = NextTurn(ready_at=50.0, think_s=0.0, tokens=3000, cached=20_000)
    one = prefill_s(LLAMA, stats, 3000, 20_000)
    assert one > 0
    assert math.isclose(stall_s((sure, late), LLAMA, stats, 0.0, 5.0), one)
    assert stall_s((late,), LLAMA, stats, 0.0, 5.0) == 0.0


def test_a_llama_server_runs_no_more_prompts_beside_an_answer_than_its_other_slots() -> None:
    """Eight agents at home on two slots: only one of them can prefill beside this answer at a
    time; the rest wait for a slot (their own turns' queue, not this answer's stall)."""
    learned = LearnedState()
    stats = learned.for_deployment(LLAMA, EngineKind.LLAMACPP)
    turns = tuple(NextTurn(ready_at=1.0, think_s=0.0, tokens=3000, cached=20_000) for _ in range(8))
    one = prefill_s(LLAMA, stats, 3000, 20_000)
    assert math.isclose(stall_s(turns, LLAMA, stats, 0.0, 5.0), 8 * one)  # vLLM's batch
    assert math.isclose(stall_s(turns, LLAMA, stats, 0.0, 5.0, room=1), one)
    assert stall_s(turns, LLAMA, stats, 0.0, 5.0, room=0) == 0.0


def test_an_answer_on_a_server_where_another_agent_lives_ends_later() -> None:
    """The estimate's time to the last token carries the stall; its first token does not."""
    coming = (NextTurn(ready_at=10.0, think_s=2.0, tokens=3000, cached=20_000),)
    for deployment, snapshot in ((LLAMA, llama_snapshot()), (VLLM, vllm_snapshot())):
        alone = estimate(
            features(), deployment, snapshot, session=None, leases=(), learned=LearnedState(), now=10.0
        )
        shared = estimate(
            features(),
            deployment,
            snapshot,
            session=None,
            leases=(),
            learned=LearnedState(),
            now=10.0,
            coming=coming,
        )
        assert shared.ttft_s == alone.ttft_s
        assert shared.stall_s > 0
        assert math.isclose(shared.total_s, alone.total_s + shared.stall_s)
        assert math.isclose(shared.decode_s, alone.decode_s + shared.stall_s)


def learned_rate(stall: float, predicted: float = 3.0, measured: float = 3.0, tokens: int = 101) -> float:
    """The decode rate learned from one vLLM answer of ``tokens`` tokens that decoded in ``measured``
    seconds, predicted to take ``predicted`` of which ``stall`` waiting for other prompts."""
    outcome = Outcome(
        "vllm",
        "m",
        EngineKind.VLLM,
        Usage(1000, tokens, 0),
        0.5,
        0.5 + measured,
        4000,
        0,
        True,
        predicted=Estimate(0, 0.0, 0.5, 0.5 + predicted, decode_s=predicted, stall_s=stall),
    )
    return learn(LearnedState(), outcome, VLLM).for_deployment(VLLM, EngineKind.VLLM).decode_tok_s.value


def test_learning_takes_the_predicted_stall_out_of_a_measured_decode() -> None:
    """A 100-token answer that took 3 s, 1 s of it waiting for a prompt that was predicted, teaches
    what 2 s would have without the stall; a stall predicted beyond what it took leaves half of it."""
    assert learned_rate(1.0) == pytest.approx(learned_rate(0.0, measured=2.0))
    assert learned_rate(1.0) > learned_rate(0.0)
    assert learned_rate(100.0, predicted=100.0, measured=3.0) == pytest.approx(
        learned_rate(0.0, measured=3.0 * STALL_KEPT)
    )


def test_an_agent_leaves_the_fast_decoder_where_another_agent_s_next_prompt_will_stall_it() -> None:
    """A 10k-token fresh prompt from a client whose answers run to 500 tokens: alone, the agent goes
    to llama.cpp (its answer ends at 7.9 s there, 9.3 s on vLLM). Another agent lives on the
    llama-server and its next turn, 10,000 tokens more, arrives 3.5 s from now: that prompt takes 3.3 s
    of the steps this answer decodes in, and the agent goes to vLLM. A reader waits for the first
    token, which no later prompt delays: it goes to vLLM either way."""
    snapshots, answers = seed_snapshots(), CODEX_500
    ask = replace(features(10_000, SessionSource.NONE), session_key=None, max_tokens=None, client="codex")
    agent = replace(ask, awaited=Awaited.LAST_TOKEN, awaited_why=TOOLS)
    other = NextTurn(ready_at=3.5, think_s=0.0, tokens=10_000, cached=20_000)
    stalled = RoutingContext(learned=answers, coming=MappingProxyType({"llama": (other,)}))

    def chosen(features: RequestFeatures, context: RoutingContext) -> str:
        decision = route(features, snapshots, BUILTIN_PROFILES["cost"], now=0.0, context=context)
        assert decision.chosen is not None
        return decision.chosen.backend_id

    assert chosen(agent, RoutingContext(learned=answers)) == "llama"
    assert chosen(agent, stalled) == "vllm"
    assert chosen(ask, stalled) == chosen(ask, RoutingContext(learned=answers)) == "vllm"


def test_equal_replicas_share_the_stall_of_the_sessions_at_home_among_them() -> None:
    """Which of two equal vLLM replicas another agent lives on is the router's to change and moves
    with every turn: each is priced by the mean (``policies.route.pooled_turns``), so the agent's
    estimates on both carry half its stall, and neither is preferred for it."""
    first = replace(vllm_snapshot(), backend_id="vllm-0", deployments=(replace(VLLM, backend_id="vllm-0"),))
    second = replace(vllm_snapshot(), backend_id="vllm-1", deployments=(replace(VLLM, backend_id="vllm-1"),))
    ask = replace(features(10_000, SessionSource.NONE), session_key=None, max_tokens=300)
    agent = replace(ask, awaited=Awaited.LAST_TOKEN, awaited_why=TOOLS)
    other = NextTurn(ready_at=1.0, think_s=1.0, tokens=3000, cached=20_000)
    context = RoutingContext(coming=MappingProxyType({"vllm-1": (other,)}))
    decision = route(agent, [first, second], BUILTIN_PROFILES["cost"], now=0.0, context=context)
    stalls = [c.estimate.stall_s for c in decision.candidates if c.estimate is not None]
    alone = estimate(
        agent, VLLM, vllm_snapshot(), session=None, leases=(), learned=LearnedState(), coming=(other,),
        share=0.5,
    )  # fmt: skip
    assert alone.stall_s > 0
    assert stalls == [pytest.approx(alone.stall_s)] * 2  # half the turn on both
    assert decision.chosen is not None
    assert decision.chosen.backend_id == "vllm-0"  # the configured order
