"""The state interface's contract, run against every implementation: in memory, and in a real Redis.
Replicas sharing one Redis are in test_state_redis.py; the store that falls back to local state when
Redis is away or slow in test_state_resilient.py."""

from __future__ import annotations

import uuid
from collections.abc import Callable, Iterator
from typing import Any

import pytest

from gateway.state import MemoryStore, SentPrompt, StateStore
from gateway.state.memory import MAX_TURNS
from gateway.state.redis_store import RedisStore
from policies.prefix import chain_of
from policies.shape import shape_of
from policies.types import SessionView
from tests.gateway.state_helpers import CHAT_A, CHAT_B, CHAT_C, REDIS_TIMEOUT_S, SYSTEM, TURN, Clock, run
from tests.redis_server import RedisServer


@pytest.fixture(params=["memory", "redis"])
def store_factory(request: pytest.FixtureRequest) -> Iterator[Callable[..., StateStore]]:
    made: list[RedisStore] = []

    def make(**kwargs: Any) -> StateStore:
        if request.param == "memory":
            return MemoryStore(**kwargs)
        server: RedisServer = request.getfixturevalue("redis_server")
        store = RedisStore(  # a namespace per test
            server.url, prefix=f"t{uuid.uuid4().hex[:8]}", timeout_s=REDIS_TIMEOUT_S, **kwargs
        )
        made.append(store)
        return store

    yield make
    for store in made:
        run(store.close())


def test_sessions_are_found_by_key_and_by_their_last_prompt(store_factory: Callable[..., StateStore]) -> None:
    store = store_factory()
    session = SessionView("s", turns=1, last_seen=1e12)
    run(store.save_session(session))
    run(store.record_prompt(SentPrompt("llama", 0, chain_of(TURN), 1500, "s")))
    assert run(store.get_session("s")) == session
    assert run(store.find_session(chain_of(TURN + b" and the next turn"))) == "s"  # continues the prompt
    assert (
        run(store.find_session(chain_of(SYSTEM + b"agent b: other work " * 100))) is None
    )  # shares the head only
    assert run(store.find_session(chain_of(TURN[:-10]))) is None


def test_the_prefix_index_knows_slots_and_recent_prompts(store_factory: Callable[..., StateStore]) -> None:
    """Per slot what was last pinned there; per backend the longest prefix of anything the RAM cache
    got: a's prompt is saved there when a task starts on another slot while a's sits idle."""
    store = store_factory()
    a, b = TURN, SYSTEM + b"agent b: other work " * 100
    run(store.record_prompt(SentPrompt("llama", 0, chain_of(a), 1500, "a")))
    store.launched("llama", 1, chain_of(b"another prompt " * 200), 700)  # the idle slot 0 is saved
    store.launched("llama", 0, chain_of(b), 1200)
    run(store.record_prompt(SentPrompt("llama", 0, chain_of(b), 1200, "b")))  # b took slot 0
    matches = run(store.match_prefix(chain_of(a + b" next"), ["llama", "vllm"]))
    llama = matches["llama"]
    assert llama.recent == 1500  # a's whole prompt, in the RAM cache's view
    slot = llama.slot(0)
    assert not slot.whole
    assert 0 < slot.tokens < 1500  # only the shared system prompt is still in slot 0
    assert matches["vllm"].recent == 0
    edited = chain_of(a[: len(SYSTEM) + 10] + b"EDIT" + a[len(SYSTEM) + 14 :])
    assert 0 < run(store.match_prefix(edited, ["llama"]))["llama"].recent < 1500


def test_a_slot_reused_as_it_is_was_never_saved(store_factory: Callable[..., StateStore]) -> None:
    """b takes a's slot before any other task starts, and shares a's long system prompt: llama-server
    reuses the slot as it is (f_keep >= 0.5) and never saves a's prompt, so the RAM cache is not
    expected to hold it. b's, idle once it ended, is saved at the next task elsewhere. One that
    shares little with the prompt that takes its slot is saved first."""
    store = store_factory()
    a, b = TURN, SYSTEM + b"agent b: other work " * 100
    run(store.record_prompt(SentPrompt("llama", 0, chain_of(a), 1500, "a")))
    nothing_saved = run(store.match_prefix(chain_of(a + b" next"), ["llama"]))["llama"]
    assert nothing_saved.recent == 0
    store.launched("llama", 0, chain_of(b), 1200)  # b on a's slot
    run(store.record_prompt(SentPrompt("llama", 0, chain_of(b), 1200, "b")))  # reused as it is
    store.launched("llama", 1, chain_of(b"z" * 4000), 1000)  # b's slot idle: saved, a's never was
    assert run(store.match_prefix(chain_of(a + b" next"), ["llama"]))["llama"].recent < 1500
    assert run(store.match_prefix(chain_of(b + b" next"), ["llama"]))["llama"].recent == 1200
    other = b"x" * 6000
    run(store.record_prompt(SentPrompt("llama", 1, chain_of(other), 1700, "c")))
    store.launched("llama", 1, chain_of(a), 1500)
    run(store.record_prompt(SentPrompt("llama", 1, chain_of(a), 1500, "a")))  # sharing nothing with c's
    saved_first = run(store.match_prefix(chain_of(other + b" more"), ["llama"]))["llama"]
    assert saved_first.recent == 1700


def test_an_unpinned_task_takes_the_most_similar_idle_slot_as_it_is(
    store_factory: Callable[..., StateStore],
) -> None:
    """Without a slot named, llama-server gives a task the idle slot most similar to it: b, on a's
    system prompt, reuses a's slot as it is (a never saved); c's prompt in the other idle slot is."""
    store = store_factory()
    a, b, c = TURN, SYSTEM + b"agent b: other work " * 100, b"w" * 5000
    run(store.record_prompt(SentPrompt("llama", 0, chain_of(a), 1500, "a")))
    run(store.record_prompt(SentPrompt("llama", 1, chain_of(c), 1400, "c")))
    store.launched("llama", None, chain_of(b), 1200)
    assert run(store.match_prefix(chain_of(a + b" next"), ["llama"]))["llama"].recent < 1500
    assert run(store.match_prefix(chain_of(c + b" next"), ["llama"]))["llama"].recent == 1400


def test_the_prefix_index_is_bounded(store_factory: Callable[..., StateStore]) -> None:
    """Per backend it tracks at most prefix_tokens_per_backend tokens, the oldest prompts out first."""
    store = store_factory(prefix_tokens_per_backend=3000)
    prompts = [bytes([65 + i]) * 4096 for i in range(4)]
    for prompt in prompts:
        run(store.record_prompt(SentPrompt("vllm", None, chain_of(prompt), 1000, None)))
    recent = [run(store.match_prefix(chain_of(p), ["vllm"]))["vllm"].recent for p in prompts]
    assert recent == [0, 1000, 1000, 1000]


def test_a_slot_keeps_the_checkpoints_its_earlier_prompts_left(
    store_factory: Callable[..., StateStore],
) -> None:
    """A short chat left a checkpoint just past the shared system prompt; the next chat on the slot
    restored it (the engine's cached count says so) and kept it: a third one is offered it."""
    store = store_factory()
    run(store.record_prompt(SentPrompt("llama", 0, chain_of(CHAT_A), 2229, "a", 0)))
    run(store.record_prompt(SentPrompt("llama", 0, chain_of(CHAT_B), 3000, "b", 1713)))
    slot = run(store.match_prefix(chain_of(CHAT_C), ["llama"]))["llama"].slot(0)
    assert (slot.whole, slot.held, slot.checkpoint) == (False, 3000, 1713)
    run(store.record_prompt(SentPrompt("llama", 0, chain_of(CHAT_B), 3000, "b")))  # the engine did not say
    assert run(store.match_prefix(chain_of(CHAT_C), ["llama"]))["llama"].slot(0).checkpoint == 0


def test_sessions_expire_and_are_bounded(store_factory: Callable[..., StateStore]) -> None:
    clock = Clock()
    store = store_factory(max_sessions=2, session_ttl_s=10, clock=clock)
    for key in ("a", "b", "c"):
        run(store.save_session(SessionView(key, last_seen=clock.now)))
    assert run(store.get_session("a")) is None  # least recently used, dropped
    clock.now += 11
    assert run(store.get_session("b")) is None  # expired


def test_slot_claims_are_compare_and_set(store_factory: Callable[..., StateStore]) -> None:
    store = store_factory()
    assert run(store.claim_slot("llama", 0, "a", 1.0, None))
    assert not run(store.claim_slot("llama", 0, "b", 2.0, None))  # a holds it; b expected it free
    assert run(store.claim_slot("llama", 0, "b", 3.0, "a"))  # evicting the holder routing saw
    assert run(store.claim_slot("llama", 0, "b", 4.0, "zzz"))  # its own slot: always fine
    assert [(lease.slot, lease.session_key) for lease in run(store.leases("llama"))] == [(0, "b")]


def test_a_session_holds_one_slot_per_backend(store_factory: Callable[..., StateStore]) -> None:
    store = store_factory()
    run(store.claim_slot("llama", 0, "a", 1.0, None))
    run(store.claim_slot("llama", 1, "a", 2.0, None))
    run(store.claim_slot("other", 0, "a", 3.0, None))
    assert [lease.slot for lease in run(store.leases("llama"))] == [1]
    assert [lease.slot for lease in run(store.leases("other"))] == [0]


def test_decision_log_is_bounded_and_newest_first(store_factory: Callable[..., StateStore]) -> None:
    store = store_factory(max_decisions=3)
    for index in range(5):
        run(store.record_decision({"n": index}))
    assert run(store.decisions(10)) == [{"n": 4}, {"n": 3}, {"n": 2}]
    assert run(store.decisions(1)) == [{"n": 4}]


def test_sessions_are_listed_most_recent_first_with_their_timelines(
    store_factory: Callable[..., StateStore],
) -> None:
    clock = Clock()
    store = store_factory(max_sessions=3, clock=clock)
    for index, key in enumerate(("a", "b", "c", "d")):
        run(store.save_session(SessionView(key, last_seen=clock.now + index)))
        run(store.record_turn(key, {"turn": 1, "key": key}))
    assert [s.key for s in run(store.sessions(10))] == ["d", "c", "b"]
    assert [s.key for s in run(store.sessions(1))] == ["d"]
    run(store.record_turn("d", {"turn": 2, "key": "d"}))
    assert [t["turn"] for t in run(store.turns("d"))] == [1, 2]
    assert run(store.turns("a")) == []  # forgotten with its session


def test_timelines_in_memory_are_bounded_across_sessions() -> None:
    """Past ``timeline_turns`` in all, the session that went longest without a turn loses its
    oldest turns first (each session alone keeps at most MAX_TURNS): the soak's sessions used to
    grow to 500 turns each, and 10,000 sessions could hold 5 million."""
    store = MemoryStore(timeline_turns=5)
    for turn in range(3):
        run(store.record_turn("a", {"n": turn}))
    run(store.record_turn("b", {"n": 0}))
    run(store.record_turn("a", {"n": 3}))  # a is the most recent now
    run(store.record_turn("b", {"n": 1}))  # 6 turns: a, which went longest without one, loses its oldest
    assert [t["n"] for t in run(store.turns("a"))] == [1, 2, 3]
    assert [t["n"] for t in run(store.turns("b"))] == [0, 1]
    run(store.record_turn("c", {"n": 0}))  # a went longest without a turn: it loses its oldest
    assert [t["n"] for t in run(store.turns("a"))] == [2, 3]
    for turn in range(1, 5):
        run(store.record_turn("c", {"n": turn}))
    assert run(store.turns("a")) == []  # emptied, the least recent session first
    assert run(store.turns("b")) == []
    assert [t["n"] for t in run(store.turns("c"))] == [0, 1, 2, 3, 4]


def test_a_full_timeline_counts_once() -> None:
    """A session at MAX_TURNS drops its own oldest turn as it appends: the total does not grow."""
    store = MemoryStore(timeline_turns=MAX_TURNS + 1)
    for turn in range(MAX_TURNS + 10):
        run(store.record_turn("a", {"n": turn}))
    run(store.record_turn("b", {"n": 0}))
    assert len(run(store.turns("a"))) == MAX_TURNS
    assert run(store.turns("b")) == [{"n": 0}]


def test_a_sessions_slots_are_released(store_factory: Callable[..., StateStore]) -> None:
    store = store_factory()
    run(store.claim_slot("llama", 1, "a", 1.0, None))
    run(store.claim_slot("other", 0, "a", 1.0, None))
    run(store.claim_slot("llama", 0, "b", 1.0, None))
    assert sorted(run(store.release_slots("a"))) == [("llama", 1), ("other", 0)]
    assert [(lease.slot, lease.session_key) for lease in run(store.leases("llama"))] == [(0, "b")]
    assert run(store.leases("other")) == ()


def test_the_live_policy_is_kept(store_factory: Callable[..., StateStore]) -> None:
    store = store_factory()
    assert run(store.policy()) is None
    run(store.save_policy({"profile": "cost", "drained": ["llama"], "changed_at": 5.0}))
    assert run(store.policy()) == {"profile": "cost", "drained": ["llama"], "changed_at": 5.0}


def test_a_finished_turn_is_written_in_one_batch(store_factory: Callable[..., StateStore]) -> None:
    clock = Clock()
    store = store_factory(max_sessions=1, clock=clock)
    run(store.save_session(SessionView("old", last_seen=clock.now)))
    new = SessionView("new", turns=1, last_seen=clock.now + 1)
    run(store.finish_turn(new, {"turn": 1}, {"request_id": "r"}))
    assert run(store.get_session("new")) == new
    assert run(store.get_session("old")) is None  # still bounded
    assert run(store.turns("new")) == [{"turn": 1}]
    assert run(store.decisions(5)) == [{"request_id": "r"}]
    run(store.finish_turn(None, None, {"request_id": "refused"}))
    assert [d["request_id"] for d in run(store.decisions(5))] == ["refused", "r"]


def test_a_session_comes_back_whole(store_factory: Callable[..., StateStore]) -> None:
    """Its last prompt's mark and per-message shape too (Redis packs the shape as arrays)."""
    clock = Clock()
    store = store_factory(clock=clock)
    messages = [
        {"role": "system", "content": "x" * 3000},
        {"role": "user", "content": "fix", "reasoning": "r"},
    ]
    session = SessionView(
        "s", backend_id="llama", slot=1, prompt_tokens=900, turns=3, last_seen=clock.now,
        prompt=chain_of(b"y" * 5000).mark, shape=shape_of(messages), source="header", saved_s=1.5,
    )  # fmt: skip
    run(store.save_session(session))
    assert run(store.get_session("s")) == session
    assert run(store.sessions(1)) == [session]


def test_a_restarted_backend_is_forgotten(store_factory: Callable[..., StateStore]) -> None:
    """Its leases and what the index says it holds go; the other backends' stay."""
    store = store_factory()
    run(store.record_prompt(SentPrompt("llama", 0, chain_of(TURN), 1500, "s")))
    run(store.record_prompt(SentPrompt("vllm", None, chain_of(TURN), 1500, "s")))
    run(store.claim_slot("llama", 0, "s", 1.0, None, 1500))
    run(store.forget_backend("llama"))
    assert run(store.leases("llama")) == ()
    matches = run(store.match_prefix(chain_of(TURN + b" more"), ["llama", "vllm"]))
    assert (matches["llama"].recent, matches["llama"].slots) == (0, ())
    assert matches["vllm"].recent == 1500
