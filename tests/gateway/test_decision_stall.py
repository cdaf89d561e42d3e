"""What a candidate is expected to wait for while it decodes (``Estimate.stall_s``,
``policies.coming``), in the decision log and on the dashboard's decision page."""

from __future__ import annotations

from types import MappingProxyType

from msgspec.structs import replace

from gateway.admin.views import templates
from gateway.decisions import decision_entry
from gateway.routed import Routed
from policies import BUILTIN_PROFILES, route
from policies.awaited import TOOLS
from policies.coming import NextTurn
from policies.context import RoutingContext
from policies.types import Awaited, SessionSource
from tests.policies.cost_helpers import CODEX_500, features, seed_snapshots


def test_the_decision_log_and_page_show_what_each_candidate_waits_for() -> None:
    """``stall_s`` reaches the decision log entry and the dashboard's decision page, on the candidate
    that waits (the llama-server where the other agent lives), and only there."""
    ask = replace(features(10_000, SessionSource.NONE), session_key=None, max_tokens=None, client="codex")
    agent = replace(ask, awaited=Awaited.LAST_TOKEN, awaited_why=TOOLS)
    other = NextTurn(ready_at=3.5, think_s=0.0, tokens=10_000, cached=20_000)
    context = RoutingContext(learned=CODEX_500, coming=MappingProxyType({"llama": (other,)}))
    decision = route(agent, seed_snapshots(), BUILTIN_PROFILES["cost"], now=0.0, context=context)
    entry = decision_entry(Routed(decision, agent, None), "r1", None, 200, at=0.0)
    stalls = {c["backend"]: c["stall_s"] for c in entry["candidates"]}
    assert stalls["vllm"] == 0.0
    assert stalls["llama"] > 3.0  # the other agent's 10,000 tokens at 3,000 a second
    page = templates.get_template("decision.html").render(
        d=entry, page="decision", who="t", csrf="", title=""
    )
    assert f"(waits {stalls['llama']} s for other prompts)" in page
    assert page.count("for other prompts") == 1
