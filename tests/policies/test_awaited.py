"""An agent waits for the last token (issue #61, ``policies.awaited``): requests with tools, from an
agent's session header or in a session of an agent are routed by the predicted time to the last token;
chat without tools keeps the first. The expected answer is the session's, else its client's, else the
model's, capped by ``max_tokens``."""

from __future__ import annotations

from types import MappingProxyType

import pytest
from msgspec.structs import replace

from policies import EngineKind, RequestFeatures
from policies.awaited import AGENT_HEADER, AGENT_SESSION, TOOLS, awaited_of, client_of, in_session
from policies.context import RoutingContext
from policies.cost import expected_output
from policies.decision import Outcome
from policies.ewma import Ewma
from policies.features import extract
from policies.learning import LearnedState, learn
from policies.learning_merge import merge
from policies.profiles import BUILTIN_PROFILES
from policies.route import route
from policies.types import Awaited, Endpoint, SessionSource, SessionView, Usage
from tests.policies.cost_helpers import (
    CODEX_500,
    VLLM,
    features,
    llama_snapshot,
    seed_snapshots,
    vllm_snapshot,
)

TOOL = {"type": "function", "function": {"name": "read", "parameters": {"type": "object"}}}
CHAT = {"model": "m", "messages": [{"role": "user", "content": "hi"}]}


@pytest.mark.parametrize(
    ("body", "source", "expected"),
    [
        ({**CHAT, "tools": [TOOL]}, SessionSource.HEADER, (Awaited.LAST_TOKEN, TOOLS)),
        (CHAT, SessionSource.AGENT_HEADER, (Awaited.LAST_TOKEN, AGENT_HEADER)),
        ({**CHAT, "tools": []}, SessionSource.HEADER, (Awaited.FIRST_TOKEN, "")),
        (CHAT, SessionSource.NONE, (Awaited.FIRST_TOKEN, "")),
    ],
)
def test_what_a_request_waits_for(body: dict, source: SessionSource, expected: tuple[Awaited, str]) -> None:  # type: ignore[type-arg]
    assert awaited_of(body, source) == expected


def test_every_api_with_tools_waits_for_the_last_token() -> None:
    anthropic = {"model": "m", "max_tokens": 64, "messages": CHAT["messages"], "tools": [{"name": "read"}]}
    responses = {"model": "m", "input": "hi", "tools": [{"type": "function", "name": "read"}]}
    for body, endpoint in (
        ({**CHAT, "tools": [TOOL]}, Endpoint.CHAT),
        (anthropic, Endpoint.MESSAGES),
        (responses, Endpoint.RESPONSES),
    ):
        got = extract(body, endpoint, model="m", headers={"user-agent": "claude-cli/2.0.14 (external, cli)"})
        assert (got.awaited, got.awaited_why, got.client) == (Awaited.LAST_TOKEN, TOOLS, "claude-cli")
    plain = extract(CHAT, Endpoint.CHAT, model="m", headers={})
    assert (plain.awaited, plain.client) == (Awaited.FIRST_TOKEN, "")


def test_client_is_the_user_agents_first_product() -> None:
    assert client_of({"user-agent": "codex_cli_rs/0.46.0 (Ubuntu 24.4.0; x86_64)"}) == "codex_cli_rs"
    assert client_of({"user-agent": "OpenAI/Python 1.109.1"}) == "openai"
    assert client_of({}) == ""


def test_a_session_of_an_agent_waits_for_the_last_token_without_tools() -> None:
    plain = features()
    assert in_session(plain, SessionView("s", agent=True)).awaited_why == AGENT_SESSION
    assert in_session(plain, SessionView("s")).awaited is Awaited.FIRST_TOKEN
    assert in_session(plain, None) is plain


def test_expected_answer_is_the_sessions_then_the_clients_then_the_models() -> None:
    learned = LearnedState(clients=MappingProxyType({"m codex": Ewma(900.0, 256.0, samples=3)}))
    ask = replace(features(), max_tokens=None, client="codex")
    assert expected_output(ask, learned) == 900
    assert expected_output(ask, learned, SessionView("s", answer_tokens=420.0)) == 420
    assert expected_output(replace(ask, client="other"), learned) == round(
        learned.for_model("m").completion_tokens.value
    )
    assert expected_output(replace(ask, max_tokens=300), learned) == 300  # capped


def test_answers_are_learned_per_client_and_merged_across_replicas() -> None:
    def answered(tokens: int, client: str) -> Outcome:
        return Outcome(
            "vllm", "m", EngineKind.VLLM, Usage(2000, tokens, 0), 0.3, 5.0, 8000, 0, True, client=client
        )

    state = LearnedState()
    for _ in range(20):
        state = learn(state, answered(600, "codex"), VLLM)
    assert state.clients["m codex"].value == pytest.approx(600, rel=0.05)  # the model's answers to codex
    assert set(state.clients) == {"m codex"}
    other = learn(LearnedState(), answered(100, "opencode"), VLLM)
    assert set(merge(state, [other]).clients) == {"m codex", "m opencode"}


def profiled(ask: RequestFeatures) -> tuple[str, str, str]:
    """Where ``cost`` sends ``ask`` between a vLLM that prefills fast and decodes slowly and a
    llama.cpp that prefills slowly and decodes fast (the seeds' single-5090 shapes)."""
    decision = route(
        ask, seed_snapshots(), BUILTIN_PROFILES["cost"], now=0.0, context=RoutingContext(learned=CODEX_500)
    )
    assert decision.chosen is not None
    return decision.chosen.backend_id, decision.objective, decision.reason.value


def test_an_agent_goes_where_its_answer_ends_first_a_chat_where_it_starts() -> None:
    """A fresh 10k-token prompt from a client whose answers run to 500 tokens: vLLM starts 1.8 s
    sooner (1.5 s against 3.3 s) and ends 1.6 s later (7.8 s of decode against 4.6 s): the agent goes
    to llama.cpp, the chat to vLLM."""
    ask = replace(features(10_000, SessionSource.NONE), session_key=None, max_tokens=None, client="codex")
    assert profiled(ask) == ("vllm", "first-token", "lowest-predicted-ttft")
    agent = replace(ask, awaited=Awaited.LAST_TOKEN, awaited_why=TOOLS)
    assert profiled(agent) == ("llama", "last-token", "lowest-predicted-completion")


def test_the_decision_says_why_the_last_token() -> None:
    ask = replace(features(10_000, SessionSource.NONE), session_key=None, max_tokens=500)
    both = [vllm_snapshot(), llama_snapshot()]
    agent = replace(ask, awaited=Awaited.LAST_TOKEN, awaited_why=TOOLS)
    decision = route(agent, both, BUILTIN_PROFILES["cost"], now=0.0)
    assert (decision.objective, decision.objective_why) == ("last-token", TOOLS)
    ttft_only = route(agent, both, BUILTIN_PROFILES["cost-ttft"], now=0.0)
    assert (ttft_only.objective, ttft_only.objective_why) == ("first-token", "")
