"""The state interface's contract, run against every implementation: in memory, and in a real Redis."""

from __future__ import annotations

import asyncio
import dataclasses
import time
import uuid
from collections.abc import Callable, Coroutine, Iterator
from typing import Any

import msgspec
import pytest
from msgspec.structs import replace

from gateway.state import MemoryStore, SentPrompt, StateStore, prompt_log
from gateway.state.memory import MAX_TURNS
from gateway.state.prompt_log import PromptRecord
from gateway.state.redis_store import RedisStore, pack, unpack
from gateway.state.resilient import RETRY_S, ResilientStore
from policies.prefix import chain_of
from policies.shape import shape_of
from policies.types import SessionView, SlotLease
from tests.redis_server import RedisServer


class Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


LOOP = asyncio.new_event_loop()
"""One loop for the module: a Redis client belongs to the loop it was made in."""
REDIS_TIMEOUT_S = 5.0
"""The Redis stores' call timeout here: a reply slow on a busy machine is no failure (the default,
0.25 s, is for a gateway, which routes on local state meanwhile)."""


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


def run(coroutine: Coroutine[Any, Any, Any]) -> Any:
    return LOOP.run_until_complete(coroutine)


SYSTEM = b"shared system prompt and tools " * 200  # ~6 KiB every agent starts with
TURN = SYSTEM + b"agent a: fix the tests " * 100


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
    """Per slot what was last pinned there; per backend the longest prefix of anything sent lately."""
    store = store_factory()
    a, b = TURN, SYSTEM + b"agent b: other work " * 100
    run(store.record_prompt(SentPrompt("llama", 0, chain_of(a), 1500, "a")))
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


def test_the_prefix_index_is_bounded(store_factory: Callable[..., StateStore]) -> None:
    """Per backend it tracks at most prefix_tokens_per_backend tokens, the oldest prompts out first."""
    store = store_factory(prefix_tokens_per_backend=3000)
    prompts = [bytes([65 + i]) * 4096 for i in range(4)]
    for prompt in prompts:
        run(store.record_prompt(SentPrompt("vllm", None, chain_of(prompt), 1000, None)))
    recent = [run(store.match_prefix(chain_of(p), ["vllm"]))["vllm"].recent for p in prompts]
    assert recent == [0, 1000, 1000, 1000]


CHAT_A = SYSTEM + b"chat a: hello " * 160  # 2229 tokens, say: checkpoints at 1713 and 2225
CHAT_B = SYSTEM + b"chat b: other words " * 100  # 3000 tokens
CHAT_C = SYSTEM + b"chat c: a third one " * 100


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


def test_two_gateways_on_one_redis_never_pin_two_sessions_to_one_slot(redis_server: RedisServer) -> None:
    """200 sessions, two stores (two replicas) claiming 4 slots at once, each claim racing the other's."""
    prefix = f"race{uuid.uuid4().hex[:6]}"
    # 200 connections open at once: a connect may take longer than the store's 0.25 s default
    replicas = [RedisStore(redis_server.url, prefix=prefix, timeout_s=REDIS_TIMEOUT_S) for _ in range(2)]

    async def claim(store: RedisStore, session: str) -> tuple[str, int] | None:
        for slot in range(4):
            if await store.claim_slot("llama", slot, session, time.time(), None):
                return session, slot
        return None

    async def race() -> list[tuple[str, int] | None]:
        jobs = [claim(replicas[i % 2], f"s{i}") for i in range(200)]
        return list(await asyncio.gather(*jobs))

    won = [w for w in run(race()) if w is not None]
    held = run(replicas[0].leases("llama"))
    assert len(won) == 4  # each slot went to exactly one session, whichever replica asked
    assert sorted(slot for _, slot in won) == [0, 1, 2, 3]
    assert {(lease.slot, lease.session_key) for lease in held} == {(slot, s) for s, slot in won}
    for store in replicas:
        run(store.close())


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


def test_a_session_written_before_shapes_said_how_they_were_digested_reads_back() -> None:
    """Redis records of an older turnout pack the shape in two fields; their digests are BLAKE2b's (1),
    which today's shapes are never compared with (``policies.shape.DIGESTS``)."""
    shape = shape_of([{"role": "user", "content": "fix"}])
    session = SessionView("s", backend_id="llama", shape=shape)
    messages = [(m.role, m.chars, m.digest, m.pieces, m.reasoning) for m in shape.messages]
    older = msgspec.msgpack.encode((replace(session, shape=None), (shape.tools, messages)))
    assert unpack(older) == replace(session, shape=replace(shape, digests=1))
    assert unpack(pack(session)) == session


async def _until(condition: Callable[[], Coroutine[Any, Any, bool]], within_s: float = 30.0) -> bool:
    deadline = time.monotonic() + within_s
    while time.monotonic() < deadline:
        if await condition():
            return True
        await asyncio.sleep(0.02)
    return False


def test_replicas_share_the_prefix_index_and_a_new_one_reads_it_all(redis_server: RedisServer) -> None:
    """What replica A sent where reaches B's index through the stream; a replica started later (a
    restart) reads the whole stream first. No prompt text travels: only chunk hashes."""
    prefix = f"t{uuid.uuid4().hex[:8]}"
    a, b = (RedisStore(redis_server.url, prefix=prefix, timeout_s=REDIS_TIMEOUT_S) for _ in range(2))
    follower = LOOP.create_task(b.follow())
    nxt = chain_of(TURN + b" and the next turn")

    async def b_knows(store: RedisStore = b) -> bool:
        match = (await store.match_prefix(nxt, ["llama"]))["llama"]
        return bool(match.slots) and match.slots[0].whole and await store.find_session(nxt) == "s"

    async def scenario() -> None:
        await a.record_prompt(SentPrompt("llama", 0, chain_of(TURN), 1500, "s"))
        await a.finish_turn(SessionView("s", turns=1, last_seen=time.time()), None, {"request_id": "r"})
        assert await _until(b_knows)  # the record went with the request's last batch of writes
        match = (await b.match_prefix(nxt, ["llama"]))["llama"]
        assert (match.slots[0].slot, match.slots[0].tokens, match.recent) == (0, 1500, 1500)
        later = RedisStore(redis_server.url, prefix=prefix, timeout_s=REDIS_TIMEOUT_S)
        task = asyncio.create_task(later.follow())
        try:
            assert await _until(lambda: b_knows(later))
        finally:
            task.cancel()
            await later.close()
        raw = await a._redis.xrange(f"{prefix}:v1:prompts")
        assert TURN[:64] not in raw[0][1][b"r"]

    try:
        run(scenario())
    finally:
        follower.cancel()
        run(a.close())
        run(b.close())


def test_replicas_rebuild_the_same_slot_checkpoints(redis_server: RedisServer) -> None:
    """The engine's cached counts travel with the records: another replica's index keeps the same
    checkpoints per slot (here through the resilient store every gateway on Redis uses)."""
    prefix = f"t{uuid.uuid4().hex[:8]}"
    a = ResilientStore(
        RedisStore(redis_server.url, prefix=prefix, timeout_s=REDIS_TIMEOUT_S), MemoryStore(), time.monotonic
    )
    b = RedisStore(redis_server.url, prefix=prefix, timeout_s=REDIS_TIMEOUT_S)
    follower = LOOP.create_task(b.follow())
    third = chain_of(CHAT_C)

    async def checkpoint(store: StateStore) -> int:
        return (await store.match_prefix(third, ["llama"]))["llama"].slot(0).checkpoint

    async def scenario() -> None:
        await a.record_prompt(SentPrompt("llama", 0, chain_of(CHAT_A), 2229, "a", 0))
        await a.record_prompt(SentPrompt("llama", 0, chain_of(CHAT_B), 3000, "b", 1713))
        await a.finish_turn(None, None, {"request_id": "r"})
        assert await checkpoint(a) == 1713
        assert await _until(lambda: _is(checkpoint(b), 1713))

    try:
        run(scenario())
    finally:
        follower.cancel()
        run(a.redis.close())
        run(b.close())


async def _is(value: Coroutine[Any, Any, int], expected: int) -> bool:
    return await value == expected


def test_a_prompt_record_carries_the_cached_count_and_older_ones_read_back() -> None:
    """Records of a turnout from before ``cached`` have eight fields: they read back with None."""
    record = PromptRecord("r1", SentPrompt("llama", 0, chain_of(CHAT_A), 2229, "a", 1713))
    packed = prompt_log.pack(record)
    assert prompt_log.unpack(packed) == record
    older = msgspec.msgpack.encode(msgspec.msgpack.decode(packed)[:8])
    assert prompt_log.unpack(older) == dataclasses.replace(
        record, sent=dataclasses.replace(record.sent, cached=None)
    )


def test_replicas_see_each_others_shared_values_until_they_expire(redis_server: RedisServer) -> None:
    """Until its TTL on the stores' clock; Redis drops the value itself then too."""
    prefix, clock = f"t{uuid.uuid4().hex[:8]}", Clock()
    a, b = (
        RedisStore(redis_server.url, prefix=prefix, timeout_s=REDIS_TIMEOUT_S, clock=clock) for _ in range(2)
    )

    async def scenario() -> None:
        await a.share("load", b"from a", 60.0)
        await b.share("load", b"from b", 5.0)
        assert await a.shared("load") == [b"from b"]  # not its own
        assert await b.shared("load") == [b"from a"]
        assert 0 < await a._redis.pttl(f"{prefix}:v1:load:{b.replica}") <= 5000
        clock.now += 5.1  # b died: its value goes
        assert await a.shared("load") == []
        assert await b.shared("load") == [b"from a"]  # a's lives on

    try:
        run(scenario())
    finally:
        run(a.close())
        run(b.close())


class LateRedis:
    """A Redis that answers no call within the timeout: each call it is asked is counted, then times out."""

    def __init__(self) -> None:
        self.calls = 0

    async def _late(self) -> Any:
        self.calls += 1
        raise TimeoutError("Timeout reading from 127.0.0.1:6379")

    async def ping(self) -> None:
        await self._late()

    async def get_session(self, key: str) -> SessionView | None:
        return await self._late()  # type: ignore[no-any-return]

    async def save_session(self, session: SessionView) -> None:
        await self._late()


def test_a_slow_redis_is_asked_once_per_retry_period() -> None:
    """Once a call timed out, the gateway's store answers from its local copy and asks Redis again (a
    ping) at most once per RETRY_S: a slow Redis costs one call a timeout, not every call."""
    clock, late = Clock(), LateRedis()
    store = ResilientStore(late, MemoryStore(clock=clock), clock)  # type: ignore[arg-type]
    session = SessionView("s", turns=1, last_seen=clock.now)
    run(store.save_session(session))
    assert (late.calls, store.degraded) == (1, True)
    for _ in range(20):
        assert run(store.get_session("s")) == session  # the local copy
    assert late.calls == 1
    clock.now += RETRY_S / 2
    run(store.get_session("s"))
    assert late.calls == 1
    clock.now += RETRY_S / 2
    for _ in range(20):
        assert run(store.get_session("s")) == session
    assert (late.calls, store.degraded) == (2, True)  # one ping, which timed out too


class ReturningRedis:
    """A Redis away, then back (``up``): each write takes a round trip, in which other calls run."""

    def __init__(self) -> None:
        self.up = False
        self.claimed: list[tuple[str, int, str]] = []

    def _reached(self) -> None:
        if not self.up:
            raise ConnectionRefusedError("Connection refused")

    async def ping(self) -> None:
        self._reached()

    async def claim_slot(
        self, backend_id: str, slot: int, session_key: str, now: float, expected: str | None, tokens: int = 0
    ) -> bool:
        self._reached()
        await asyncio.sleep(0)
        self.claimed.append((backend_id, slot, session_key))
        return True

    async def leases(self, backend_id: str) -> tuple[SlotLease, ...]:
        self._reached()
        return ()


def test_requests_racing_when_redis_returns_see_it_written_back_once() -> None:
    """Several calls find Redis back at once (a request, the replicas' sync, the policy poll): one
    writes back what was claimed meanwhile, the others wait for it; none fails (calls racing through
    the write-back used to fail: "dictionary changed size during iteration", a 500)."""
    clock, redis = Clock(), ReturningRedis()
    store = ResilientStore(redis, MemoryStore(clock=clock), clock)  # type: ignore[arg-type]
    assert run(store.claim_slot("llama", 0, "a", clock.now, None))  # locally: Redis is away
    assert run(store.claim_slot("llama", 1, "b", clock.now, None))
    redis.up = True
    clock.now += RETRY_S

    async def race() -> list[tuple[SlotLease, ...]]:
        return await asyncio.gather(*(store.leases("llama") for _ in range(3)))

    assert run(race()) == [(), (), ()]  # Redis's answers
    assert not store.degraded
    assert redis.claimed == [("llama", 0, "a"), ("llama", 1, "b")]  # written back, each once


def test_retry_asks_a_returned_redis_without_traffic() -> None:
    """``/health`` calls ``retry``: an idle gateway finds Redis back (and writes back what it claimed
    meanwhile) once the retry period has passed, not before; a healthy store asks nothing."""
    clock, redis = Clock(), ReturningRedis()
    store = ResilientStore(redis, MemoryStore(clock=clock), clock)  # type: ignore[arg-type]
    assert run(store.claim_slot("llama", 0, "a", clock.now, None))  # locally: Redis is away
    assert store.degraded
    redis.up = True
    run(store.retry())
    assert store.degraded  # the retry period has not passed
    clock.now += RETRY_S
    run(store.retry())
    assert not store.degraded
    assert redis.claimed == [("llama", 0, "a")]
    redis.up = False
    run(store.retry())  # not degraded: nothing is asked
    assert not store.degraded


def test_a_store_of_one_process_shares_nothing() -> None:
    store = MemoryStore()
    run(store.share("load", b"x", 60.0))
    assert run(store.shared("load")) == []
    assert run(store.follow()) is None  # returns at once: no task to keep


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
