"""Crowded llama-servers (``policies.homes``): which server is crowded, and a session at home on one
staying there unless moving evens the load."""

from __future__ import annotations

from types import MappingProxyType

from msgspec.structs import replace

from policies.context import RoutingContext
from policies.filters import Candidate
from policies.homes import crowded, sharing, stays_home
from policies.profiles import BUILTIN_PROFILES
from policies.stages import stages
from policies.types import Reason, SessionSource, SessionView
from tests.policies.cost_helpers import LLAMA, VLLM, features, llama_snapshot, vllm_snapshot


def server(name: str, slots: int = 2) -> Candidate:
    snapshot = replace(llama_snapshot((False,) * slots), backend_id=name)
    return replace(LLAMA, backend_id=name), snapshot


CANDIDATES = [server("llama-0"), server("llama-1"), server("llama-2"), (VLLM, vllm_snapshot())]
AT_HOME = SessionView("s", "llama-0", 0, prompt_tokens=9000, turns=3)


def context(homes: dict[str, int], session: SessionView | None = AT_HOME) -> RoutingContext:
    return RoutingContext(session=session, homes=MappingProxyType(homes))


def kept(homes: dict[str, int], session: SessionView | None = AT_HOME, prompt: int = 10_000) -> list[str]:
    out, dropped = stays_home(features(prompt), CANDIDATES, context(homes, session))
    assert all(r.reason is Reason.STAYS_HOME for r in dropped)
    assert len(out) + len(dropped) == len(CANDIDATES)
    return [snapshot.backend_id for _, snapshot in out]


def test_a_server_is_crowded_with_more_active_sessions_at_home_than_slots() -> None:
    _, llama = server("llama-0")
    assert not crowded(llama, {"llama-0": 1}, AT_HOME)  # the session and one other: 2 for 2 slots
    assert crowded(llama, {"llama-0": 2}, AT_HOME)  # 3 for 2
    assert not crowded(llama, {"llama-0": 2}, SessionView("n"))  # a newcomer is not at home yet
    assert not crowded(llama, {"llama-0": 2}, replace(AT_HOME, backend_id="llama-1"))  # nor one elsewhere
    assert crowded(llama, {"llama-0": 3}, None)
    assert sharing(llama, {"llama-0": 3}, None) == 3
    assert sharing(llama, {"llama-0": 1}, AT_HOME) == 0
    assert not crowded(vllm_snapshot(), {"vllm": 50}, AT_HOME)  # vLLM has no slots to share


def test_a_session_on_a_crowded_server_stays_unless_moving_evens_the_load() -> None:
    # 4 sessions on llama-0's 2 slots, the session included; llama-1 has 3: after a move 4 there
    assert kept({"llama-0": 3, "llama-1": 3, "llama-2": 3}) == ["llama-0", "vllm"]
    # llama-2 has 2: after the move it carries 3, llama-0 keeps 3: even
    assert kept({"llama-0": 3, "llama-1": 3, "llama-2": 2}) == ["llama-0", "llama-2", "vllm"]


def test_the_rule_is_off_where_the_home_is_not_crowded_or_not_a_candidate() -> None:
    everything = ["llama-0", "llama-1", "llama-2", "vllm"]
    assert kept({"llama-0": 1, "llama-1": 0}) == everything  # 2 sessions for 2 slots
    elsewhere = replace(AT_HOME, backend_id="llama-9")  # its home is down or drained
    assert kept({"llama-9": 5}, elsewhere) == everything
    assert kept({"llama-0": 3}, replace(AT_HOME, backend_id="vllm")) == everything


def test_a_first_turn_or_an_unproven_conversation_has_no_home_to_keep() -> None:
    everything = ["llama-0", "llama-1", "llama-2", "vllm"]
    assert kept({"llama-0": 5}, None) == everything
    assert kept({"llama-0": 5}, replace(AT_HOME, turns=0)) == everything
    implicit = features(source=SessionSource.IMPLICIT)
    out, _ = stays_home(implicit, CANDIDATES, context({"llama-0": 5}, replace(AT_HOME, turns=0)))
    assert len(out) == len(CANDIDATES)


def test_a_rejection_says_why_the_session_stays() -> None:
    _, dropped = stays_home(features(), CANDIDATES, context({"llama-0": 3, "llama-1": 3, "llama-2": 3}))
    assert dropped[0].backend_id == "llama-1"
    assert dropped[0].detail == (
        "the session stays on llama-0 (4 sessions for its 2 slots): llama-1 has 3 for 2, "
        "moving would not even them"
    )


def test_the_cost_profiles_run_it_and_the_published_routers_do_not() -> None:
    for name in ("cost", "cost-completion"):
        assert "stays-home" in [stage for stage, _ in stages(BUILTIN_PROFILES[name].filters)]
    for name in ("dynamo-kv", "llm-d", "least-loaded"):
        assert "stays-home" not in BUILTIN_PROFILES[name].filters
