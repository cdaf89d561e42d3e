"""Routing state in Redis, shared by every gateway replica (``state.url``).

Key layout (``<prefix>`` = ``state.prefix``, ``v1`` = :data:`VERSION`: a layout change bumps it, so
two turnout versions never read each other's values):

    <prefix>:v1:session:<key>       string  msgpack [SessionView, its shape as arrays]; expires with the TTL
    <prefix>:v1:sessions            zset    session key -> last seen (the most recent first; bounded)
    <prefix>:v1:turns:<key>         list    the session's timeline, JSON turns (bounded; expires with it)
    <prefix>:v1:leases:<backend>    hash    slot -> JSON {session, last_used, tokens}
    <prefix>:v1:decisions           list    JSON decision entries, newest first (capped)
    <prefix>:v1:policy              string  JSON {profile, drained, changed_at}: an admin's live policy
    <prefix>:v1:prompts             stream  the prefix index's records, msgpack (capped; ``prompt_log``)
    <prefix>:v1:replicas:<kind>     zset    replica -> when its ``kind`` expires (ms)
    <prefix>:v1:learned:<replica>   string  msgpack: what a replica learned (``gateway.replicas``)
    <prefix>:v1:load:<replica>      string  msgpack: its requests in flight per backend (expires)
    <prefix>:v1:key:<name>:requests zset    request id -> started: a key's last minute (gateway.key_limits)
    <prefix>:v1:key:<name>:tokens   zset    "<request id>:<tokens>" -> ended: its last minute
    <prefix>:v1:key:<name>:running  zset    request id -> started, until it ends (dropped after 900 s)
    <prefix>:v1:key:<name>:usage    hash    requests, prompt/cached/completion tokens that ended (kept)

Slot claims are one Lua script (compare-and-set: the slot's holder must still be the one routing saw,
and the session's other slot on that backend is released in the same step), so two replicas never
pin two sessions to one slot. The prefix index (what each backend, slot and RAM cache holds) is
matched in each replica's memory and shared through the ``prompts`` stream (``prompt_log``).
"""

from __future__ import annotations

import os
import secrets
import socket
import time
from collections.abc import Callable, Sequence
from typing import Any

import msgspec
import redis.asyncio as redis
from msgspec.structs import replace
from redis.asyncio.retry import Retry
from redis.backoff import NoBackoff
from redis.exceptions import RedisError
from tenacity import AsyncRetrying, retry_if_exception_type, wait_fixed

from gateway.state import prompt_log
from gateway.state.base import StateStore
from gateway.state.prefix_index import PrefixIndex, SentPrompt
from gateway.state.prompt_log import PromptRecord
from policies.prefix import PromptChain
from policies.shape import MessageMark, PromptShape
from policies.types import PrefixMatch, SessionView, SlotLease

VERSION = "v1"
FAILURES = (RedisError, OSError, TimeoutError)
"""What a Redis that is away or slow raises."""
MAX_TURNS = 500

CLAIM = """
local holder = redis.call('HGET', KEYS[1], ARGV[1])
if holder then
  local owner = cjson.decode(holder)['session']
  if owner ~= ARGV[2] and owner ~= ARGV[3] then return 0 end
end
local all = redis.call('HGETALL', KEYS[1])
for i = 1, #all, 2 do
  if all[i] ~= ARGV[1] and cjson.decode(all[i + 1])['session'] == ARGV[2] then
    redis.call('HDEL', KEYS[1], all[i])
  end
end
redis.call('HSET', KEYS[1], ARGV[1], ARGV[4])
return 1
"""
"""KEYS[1] leases hash; ARGV: slot, session, expected owner ('' = free), the new lease's JSON."""


def connect(url: str, timeout_s: float) -> redis.Redis:
    """A client that fails fast: a request must not wait on an absent or slow Redis (no retries, every
    call within ``timeout_s``; the callers fall back to local state)."""
    return redis.Redis.from_url(
        url, socket_timeout=timeout_s, socket_connect_timeout=timeout_s, retry=Retry(NoBackoff(), 0)
    )


class RedisStore(StateStore):
    shared_by_replicas = True

    def __init__(
        self,
        url: str,
        *,
        prefix: str = "turnout",
        max_sessions: int = 10_000,
        session_ttl_s: float = 6 * 3600,
        max_decisions: int = 1000,
        prefix_tokens_per_backend: int = 1_000_000,
        timeout_s: float = 0.25,
        clock: Callable[[], float] = time.time,
    ) -> None:
        self._redis = connect(url, timeout_s)
        self._ns = f"{prefix}:{VERSION}"
        self._index = PrefixIndex(max_tokens_per_backend=prefix_tokens_per_backend, max_tips=4 * max_sessions)
        self._max_sessions = max_sessions
        self._ttl_ms = int(session_ttl_s * 1000)
        self._ttl = session_ttl_s
        self._max_decisions = max_decisions
        self._clock = clock
        self._claim = self._redis.register_script(CLAIM)
        self._follower = redis.Redis.from_url(  # its reads wait for new records
            url, socket_timeout=timeout_s + prompt_log.BLOCK_MS / 1000, socket_connect_timeout=timeout_s
        )
        self._unsent: list[bytes] = []
        self.replica = f"{socket.gethostname()}-{os.getpid()}-{secrets.token_hex(3)}"
        """This process among the replicas: its records and shared values carry it."""

    def _key(self, *parts: str) -> str:
        return ":".join((self._ns, *parts))

    async def ping(self) -> None:
        await self._redis.ping()

    async def close(self) -> None:
        await self._redis.aclose()
        await self._follower.aclose()

    async def get_session(self, key: str) -> SessionView | None:
        raw = await self._redis.get(self._key("session", key))
        if raw is None:
            return None
        session = unpack(raw)
        if self._clock() - session.last_seen > self._ttl:
            return None
        return session

    async def find_session(self, chain: PromptChain) -> str | None:
        key = self._index.find_session(chain)
        return key if key is not None and await self.get_session(key) is not None else None

    async def save_session(self, session: SessionView) -> None:
        pipe = self._redis.pipeline(transaction=True)
        self._save(pipe, session)
        *_, count = await pipe.execute()
        await self._bound(count)

    def _save(self, pipe: Any, session: SessionView) -> None:
        pipe.set(self._key("session", session.key), pack(session), px=self._ttl_ms)
        pipe.zadd(self._key("sessions"), {session.key: session.last_seen})
        pipe.zcard(self._key("sessions"))

    def _turn(self, pipe: Any, key: str, turn: dict[str, Any]) -> None:
        name = self._key("turns", key)
        pipe.rpush(name, msgspec.json.encode(turn))
        pipe.ltrim(name, -MAX_TURNS, -1)
        pipe.pexpire(name, self._ttl_ms)

    def _decision(self, pipe: Any, entry: dict[str, Any]) -> None:
        pipe.lpush(self._key("decisions"), msgspec.json.encode(entry))
        pipe.ltrim(self._key("decisions"), 0, self._max_decisions - 1)

    async def finish_turn(
        self, session: SessionView | None, turn: dict[str, Any] | None, decision: dict[str, Any]
    ) -> None:
        pipe = self._redis.pipeline(transaction=False)  # one round trip
        if session is not None:
            self._save(pipe, session)
            if turn is not None:
                self._turn(pipe, session.key, turn)
        self._decision(pipe, decision)
        self._publish(pipe)
        results = await pipe.execute()
        if session is not None:
            await self._bound(results[2])

    async def _bound(self, count: int) -> None:
        if count > self._max_sessions:  # the least recently seen go, with their timelines
            dropped = await self._redis.zpopmin(self._key("sessions"), count - self._max_sessions)
            names = [self._key(kind, _text(item[0])) for item in dropped for kind in ("session", "turns")]
            await self._redis.delete(*names)

    async def record_prompt(self, sent: SentPrompt) -> None:
        self._index.record(sent)
        self.queue_prompt(sent)

    def launched(self, backend_id: str, slot: int | None, chain: PromptChain, tokens: int) -> None:
        self._index.launched(backend_id, slot, chain, tokens)

    def queue_prompt(self, sent: SentPrompt) -> None:
        """Tell the other replicas what was sent where (``prompt_log``), with the next batch of
        writes (``finish_turn``: no round trip of its own). While Redis is away the newest
        ``prompt_log.UNSENT`` wait."""
        record = PromptRecord(self.replica, sent)
        self._unsent.append(prompt_log.pack(record))
        del self._unsent[: -prompt_log.UNSENT]

    def _publish(self, pipe: Any) -> None:
        for raw in self._unsent:
            pipe.xadd(self._key("prompts"), {"r": raw}, maxlen=prompt_log.LOG_ENTRIES, approximate=True)
        self._unsent.clear()  # a failed batch loses them: records are hints, not state

    async def read_prompts(self, after: str) -> tuple[str, list[PromptRecord]]:
        """The other replicas' records after stream id ``after`` ("0": all), waiting up to
        ``BLOCK_MS`` for some, and the id to read after next."""
        reply: Any = await self._follower.xread(
            {self._key("prompts"): after}, count=prompt_log.BATCH, block=prompt_log.BLOCK_MS
        )
        records = []
        for _, entries in reply:
            for entry_id, fields in entries:
                after = _text(entry_id)
                record = prompt_log.unpack(_bytes(fields[b"r"]))
                if record.replica != self.replica:
                    records.append(record)
        return after, records

    async def follow(self) -> None:
        await follow_prompts(self, self._index)

    async def share(self, kind: str, value: bytes, ttl_s: float) -> None:
        expires = int((self._clock() + ttl_s) * 1000)
        pipe = self._redis.pipeline(transaction=False)
        pipe.set(self._key(kind, self.replica), value, px=int(ttl_s * 1000))
        pipe.zadd(self._key("replicas", kind), {self.replica: expires})
        pipe.zremrangebyscore(self._key("replicas", kind), "-inf", int(self._clock() * 1000))
        await pipe.execute()

    async def shared(self, kind: str) -> list[bytes]:
        now = int(self._clock() * 1000)
        replicas = [
            _text(r) for r in await self._redis.zrangebyscore(self._key("replicas", kind), now, "+inf")
        ]
        others = [r for r in replicas if r != self.replica]
        if not others:
            return []
        values = await self._redis.mget([self._key(kind, r) for r in others])
        return [_bytes(v) for v in values if v is not None]

    async def match_prefix(self, chain: PromptChain, backend_ids: Sequence[str]) -> dict[str, PrefixMatch]:
        return {backend: self._index.match(chain, backend) for backend in backend_ids}

    async def leases(self, backend_id: str) -> tuple[SlotLease, ...]:
        raw = await self._redis.hgetall(self._key("leases", backend_id))
        leases = []
        for slot, value in raw.items():
            lease = msgspec.json.decode(value)
            leases.append(SlotLease(int(slot), lease["session"], lease["last_used"], lease["tokens"]))
        return tuple(sorted(leases, key=lambda lease: lease.slot))

    async def claim_slot(
        self,
        backend_id: str,
        slot: int,
        session_key: str,
        now: float,
        expected_owner: str | None,
        tokens: int = 0,
    ) -> bool:
        lease = msgspec.json.encode({"session": session_key, "last_used": now, "tokens": tokens})
        claimed = await self._claim(
            keys=[self._key("leases", backend_id)], args=[str(slot), session_key, expected_owner or "", lease]
        )
        return bool(claimed)

    async def forget_backend(self, backend_id: str) -> None:
        self._index.forget(backend_id)
        await self._redis.delete(self._key("leases", backend_id))

    async def release_slots(self, session_key: str) -> list[tuple[str, int]]:
        released = []
        async for name in self._redis.scan_iter(match=self._key("leases", "*")):
            hash_key = name.decode()
            backend = hash_key.rsplit(":", 1)[-1]
            for slot, value in (await self._redis.hgetall(hash_key)).items():
                if msgspec.json.decode(value)["session"] == session_key:
                    await self._redis.hdel(hash_key, slot)
                    released.append((backend, int(slot)))
        return released

    async def sessions(self, limit: int) -> list[SessionView]:
        keys = await self._redis.zrevrange(self._key("sessions"), 0, limit - 1)
        if not keys:
            return []
        raws = await self._redis.mget([self._key("session", _text(k)) for k in keys])
        now = self._clock()
        out = [unpack(raw) for raw in raws if raw is not None]
        return [s for s in out if now - s.last_seen <= self._ttl]

    async def record_turn(self, key: str, turn: dict[str, Any]) -> None:
        pipe = self._redis.pipeline(transaction=True)
        self._turn(pipe, key, turn)
        await pipe.execute()

    async def turns(self, key: str) -> list[dict[str, Any]]:
        return [msgspec.json.decode(raw) for raw in await self._redis.lrange(self._key("turns", key), 0, -1)]

    async def save_policy(self, policy: dict[str, Any]) -> None:
        await self._redis.set(self._key("policy"), msgspec.json.encode(policy))

    async def policy(self) -> dict[str, Any] | None:
        raw = await self._redis.get(self._key("policy"))
        return None if raw is None else dict(msgspec.json.decode(raw))

    async def record_decision(self, entry: dict[str, Any]) -> None:
        pipe = self._redis.pipeline(transaction=True)
        self._decision(pipe, entry)
        await pipe.execute()

    async def decisions(self, limit: int) -> list[dict[str, Any]]:
        raws = await self._redis.lrange(self._key("decisions"), 0, limit - 1)
        return [msgspec.json.decode(raw) for raw in raws]


async def follow_prompts(store: RedisStore, index: PrefixIndex) -> None:
    """Fold the other replicas' records into ``index``, from the stream's start, until cancelled;
    while Redis is away, try again every second (the store's own calls report the outage)."""
    after = "0"
    reading = AsyncRetrying(retry=retry_if_exception_type(FAILURES), wait=wait_fixed(1.0))  # forever
    while True:
        read: tuple[str, list[PromptRecord]] = await reading(store.read_prompts, after)
        after, records = read
        for r in records:
            index.record(r.sent, seen=False)


def _text(value: Any) -> str:
    """A key as redis-py returns it (bytes; its stubs allow more)."""
    return value.decode() if isinstance(value, bytes) else str(value)


class Packed(msgspec.Struct, array_like=True):
    """A PromptShape as msgpack arrays (field names repeated per message would double it). Records
    written before shapes said how they were digested have two fields: their digests are BLAKE2b (1)."""

    tools: int
    messages: list[tuple[str, int, int, tuple[int, ...], bool]]
    digests: int = 1


def pack(session: SessionView) -> bytes:
    """A session's value: msgpack of [the session without its shape, the shape as arrays]."""
    shape = session.shape
    packed: Packed | None = None
    if shape is not None:
        messages = [(m.role, m.chars, m.digest, m.pieces, m.reasoning) for m in shape.messages]
        packed = Packed(shape.tools, messages, shape.digests)
    return msgspec.msgpack.encode((replace(session, shape=None), packed))


def unpack(raw: Any) -> SessionView:
    session, packed = msgspec.msgpack.decode(_bytes(raw), type=tuple[SessionView, Packed | None])
    if packed is None:
        return session
    marks = tuple(MessageMark(*m) for m in packed.messages)
    return replace(session, shape=PromptShape(packed.tools, marks, packed.digests))


def _bytes(value: Any) -> bytes:
    """A value as redis-py returns it (bytes without ``decode_responses``; its stubs allow str)."""
    return value if isinstance(value, bytes) else str(value).encode()
