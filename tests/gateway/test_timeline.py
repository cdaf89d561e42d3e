"""A turn's timeline record: where its prefix broke, the likely cause, and what it cost."""

from __future__ import annotations

from backends.engine_profiles import load_profile
from gateway.routed import Routed
from gateway.timeline import turn_record
from policies import Architecture, Deployment, EngineKind, Reason, RequestFeatures
from policies.decision import Decision, Estimate, Outcome, ScoredCandidate
from policies.shape import PIECE_CHARS, shape_of
from policies.types import Endpoint, SessionView, Usage

SYSTEM = {"role": "system", "content": "You are a careful coding agent. " * 100}
FIRST = [SYSTEM, {"role": "user", "content": "fix it " * 500}]
SECOND = [*FIRST, {"role": "assistant", "content": "done"}, {"role": "user", "content": "and now?"}]
PREVIOUS_TOKENS = 4000


def routed(messages: list[dict[str, str]], *, backend: str = "llama", previous_backend: str = "llama",
           source: str = "slot", note: str = "warm slot 0", expected: int = 3900,
           deployment: Deployment | None = None) -> Routed:  # fmt: skip
    deployment = deployment or Deployment("m", backend, "up")
    estimate = Estimate(expected_cached_tokens=expected, queue_s=0.0, ttft_s=0.3, total_s=2.0, slot=0,
                        source=source, note=note)  # fmt: skip
    decision = Decision(
        "cost", deployment, Reason.LOWEST_TTFT, (ScoredCandidate(deployment, 1.0, (), estimate),)
    )
    session = SessionView(key="h:s", backend_id=previous_backend, slot=0, prompt_tokens=PREVIOUS_TOKENS,
                          turns=1, shape=shape_of(FIRST))  # fmt: skip
    features = RequestFeatures("m", Endpoint.CHAT, 4100, None, False, shape=shape_of(messages))
    return Routed(decision, features, session)


def outcome(cached: int, backend: str = "llama") -> Outcome:
    kind = EngineKind.LLAMACPP if backend == "llama" else EngineKind.VLLM
    return Outcome(backend, "m", kind, Usage(4100, 50, cached), 0.5, 2.0, 16_000, 3900, True)


def test_a_turn_that_reused_its_previous_prompt_has_no_break() -> None:
    record = turn_record(routed(SECOND), outcome(3600), "r1", prefill_tok_s=3000.0, at=0.0)
    assert record["break"] is None  # 400 short: the checkpoint gap, not a break
    assert (record["prompt_tokens"], record["cached_tokens"], record["expected_cached_tokens"]) == (
        4100,
        3600,
        3900,
    )


def test_an_edited_message_names_the_message_and_the_cost() -> None:
    edited = [SYSTEM, {"role": "user", "content": "fix it " * 100 + "CHANGED" + "fix it " * 400}, *SECOND[2:]]
    record = turn_record(routed(edited), outcome(1000), "r1", prefill_tok_s=3000.0, at=0.0)
    broke = record["break"]
    assert broke["kind"] == "edited"
    offset = 700 // PIECE_CHARS * PIECE_CHARS  # the edit is at character 700
    assert (broke["message"], broke["role"], broke["offset"]) == (1, "user", offset)
    assert broke["cause"] == f"message 1 (user) was edited at character ~{offset}"
    assert (broke["lost_tokens"], broke["lost_s"]) == (3000, 1.0)


def test_with_the_prompt_intact_the_cause_is_the_routing_or_the_engine() -> None:
    moved = turn_record(routed(SECOND, backend="vllm"), outcome(0, "vllm"), "r", 6600.0, at=0.0)["break"]
    assert moved["cause"] == "moved from llama to vllm"
    lost = turn_record(
        routed(SECOND, note="session's slot was lost: full re-prefill"), outcome(0), "r", 3000.0, at=0.0
    )
    assert lost["break"]["cause"] == "its slot was evicted"
    ram = turn_record(
        routed(SECOND, source="ram", note="restore from the RAM cache"), outcome(0), "r", 3000.0, at=0.0
    )
    assert ram["break"]["cause"].startswith("RAM cache miss")
    vllm = turn_record(
        routed(SECOND, backend="vllm", previous_backend="vllm"), outcome(0, "vllm"), "r", 6600.0, at=0.0
    )
    assert vllm["break"]["cause"].startswith("vLLM kept less of it than its prefix cache should")


def test_a_vllm_turn_that_kept_what_its_rules_keep_is_not_a_break() -> None:
    """A hybrid model on vLLM without prefix caching keeps nothing of a turn, and turnout expects
    nothing: that is what the engine does, not a break (issue #60: every vLLM turn was flagged red).
    With prefix caching it keeps whole blocks: a turn that got them is not a break either."""
    none = routed(SECOND, backend="vllm", previous_backend="vllm", expected=0)
    assert turn_record(none, outcome(0, "vllm"), "r", 6600.0, at=0.0)["break"] is None
    blocks = routed(SECOND, backend="vllm", previous_backend="vllm", expected=3136)
    assert turn_record(blocks, outcome(3136, "vllm"), "r", 6600.0, at=0.0)["break"] is None
    # a move to vLLM is still named: the routing chose to leave the slot behind
    moved = routed(SECOND, backend="vllm", previous_backend="llama", expected=0)
    assert turn_record(moved, outcome(0, "vllm"), "r", 6600.0, at=0.0)["break"]["cause"].startswith("moved")


def test_a_hybrid_slot_whose_profile_checkpoints_further_back_is_not_a_break_that_far() -> None:
    """At compose's --ubatch-size 2048 a hybrid llama.cpp slot restores a checkpoint 2,048 tokens
    before the previous prompt's end where a turn diverges near that end: 2,000 tokens short is its
    checkpoint gap there, not a break; at llama-server's default micro-batch (no profile) it is one.
    A vLLM deployment's profile, whatever its micro-batch, moves nothing: vLLM keeps no checkpoints."""
    compose = load_profile("workstation-llamacpp-flash-next-cpu-moe")
    hybrid = Deployment("m", "llama", "up", architecture=Architecture.HYBRID, profile=compose)
    wide = turn_record(routed(SECOND, deployment=hybrid), outcome(2000), "r", 3000.0, at=0.0)
    assert wide["break"] is None
    plain = turn_record(routed(SECOND), outcome(2000), "r", 3000.0, at=0.0)
    assert plain["break"] is not None
    vllm_profile = load_profile("seed-5090-vllm-27b")
    assert vllm_profile.prefill.checkpoint_gap == 2048
    vllm = Deployment("m", "vllm", "up", architecture=Architecture.HYBRID, profile=vllm_profile)
    got = turn_record(
        routed(SECOND, backend="vllm", previous_backend="vllm", expected=3136, deployment=vllm),
        outcome(1568, "vllm"), "r", 6600.0, at=0.0,
    )  # fmt: skip
    assert got["break"] is not None
