"""Replicas sharing one Redis: slot claims racing, the prefix index and shared values reaching each
other, and the records they write there read back by a newer turnout."""

from __future__ import annotations

import asyncio
import dataclasses
import time
import uuid
from collections.abc import Callable, Coroutine
from typing import Any

import msgspec
from msgspec.structs import replace

from gateway.state import MemoryStore, SentPrompt, StateStore, prompt_log
from gateway.state.prompt_log import PromptRecord
from gateway.state.redis_store import RedisStore, pack, unpack
from gateway.state.resilient import ResilientStore
from policies.checkpoints import DEFAULT_GAP
from policies.prefix import chain_of
from policies.shape import shape_of
from policies.types import SessionView
from tests.gateway.state_helpers import (
    CHAT_A,
    CHAT_B,
    CHAT_C,
    LOOP,
    REDIS_TIMEOUT_S,
    TURN,
    Clock,
    run,
)
from tests.redis_server import RedisServer


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


def test_a_session_written_before_shapes_said_how_they_were_digested_reads_back() -> None:
    """Redis records of an older turnout pack the shape in two fields; their digests are BLAKE2b's (1),
    which today's shapes are never compared with (``policies.shape.DIGESTS``)."""
    shape = shape_of([{"role": "user", "content": "fix"}])
    session = SessionView("s", backend_id="llama", shape=shape)
    messages = [(m.role, m.chars, m.digest, m.pieces, m.reasoning) for m in shape.messages]
    older = msgspec.msgpack.encode((replace(session, shape=None), (shape.tools, messages)))
    assert unpack(older) == replace(session, shape=replace(shape, digests=1))
    assert unpack(pack(session)) == session


def test_a_prompt_record_carries_the_cached_count_and_older_ones_read_back() -> None:
    """Records of a turnout from before ``cached`` have eight fields: they read back with None; ones
    from before ``gap`` (the engine's checkpoint gap) read back with llama-server's default, and
    without a first user message."""
    chain = chain_of(CHAT_A)
    head = chain.mark_at(700)
    sent = SentPrompt("llama", 0, chain, 2229, "a", 1713, 300, gap=2048, first_user=120, head=head)
    record = PromptRecord("r1", sent)
    packed = prompt_log.pack(record)
    assert prompt_log.unpack(packed) == record
    older = msgspec.msgpack.encode(msgspec.msgpack.decode(packed)[:8])
    assert prompt_log.unpack(older) == dataclasses.replace(
        record,
        sent=dataclasses.replace(
            record.sent, cached=None, user_start=-1, gap=DEFAULT_GAP, first_user=-1, head=None
        ),
    )
    before_gap = msgspec.msgpack.encode(msgspec.msgpack.decode(packed)[:10])
    assert prompt_log.unpack(before_gap) == dataclasses.replace(
        record, sent=dataclasses.replace(record.sent, gap=DEFAULT_GAP, first_user=-1, head=None)
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


def test_a_store_of_one_process_shares_nothing() -> None:
    store = MemoryStore()
    run(store.share("load", b"x", 60.0))
    assert run(store.shared("load")) == []
    assert run(store.follow()) is None  # returns at once: no task to keep
