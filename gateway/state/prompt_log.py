"""The prefix index's records, shared by replicas through a capped Redis stream (``<ns>:prompts``).

Every replica appends what it sent where, with the batch of writes that ends each request
(``PromptRecord``: the backend, the llama.cpp slot, the prompt's chain of chunk hashes, the engine's
token count, the session, the tokens the engine reused, where its last user message starts, the
engine's checkpoint gap, where its first user message starts; never text) and folds the others'
records into its own in-memory ``PrefixIndex``. So every replica knows what each backend, slot and
RAM cache holds, and which checkpoints each slot can restore (rebuilt from the reused counts in
stream order), whichever replica sent it; a replica that starts reads the whole stream first, so a
restart keeps that knowledge. A record is a msgpack array (``Packed``);
fields are only ever appended: a record with fewer takes the defaults (one written before ``cached``
was: None, so the slot keeps no older checkpoints; one before ``user_start`` or ``first_user``: no
user message; one before ``gap``: llama-server's default, 516). A
turnout from before a field reads exactly the fields it knows and its follower stops at the first
record with more: upgrade the replicas that share a Redis together. The stream is capped at
``LOG_ENTRIES`` (the oldest go: by then the engines' caches have moved on too); an entry costs
about 8 bytes per KiB of prompt.
"""

from __future__ import annotations

import sys
from array import array
from dataclasses import dataclass

import msgspec

from gateway.state.prefix_index import SentPrompt
from policies.checkpoints import DEFAULT_GAP
from policies.prefix import PromptChain, PromptMark

LOG_ENTRIES = 20_000
UNSENT = 1000
"""Records kept for the next batch while Redis is away (the newest)."""
BATCH = 500
"""Records read per round trip."""
BLOCK_MS = 1000
"""How long one read waits for new records (the follower's connection allows that much more)."""


@dataclass(frozen=True, slots=True)
class PromptRecord:
    """What ``replica`` sent where."""

    replica: str
    sent: SentPrompt


class Packed(msgspec.Struct, array_like=True, frozen=True):
    """A record on the wire: a msgpack array, new fields appended with defaults (module docstring)."""

    replica: str
    backend_id: str
    slot: int | None
    hashes: bytes
    length: int
    whole: int
    tokens: int
    session_key: str | None
    cached: int | None = None
    user_start: int = -1
    gap: int = DEFAULT_GAP
    first_user: int = -1
    head: tuple[int, int | None, int] | None = None  # a PromptMark's length, last chunk and digest


def pack(record: PromptRecord) -> bytes:
    sent = record.sent
    chain = sent.chain
    hashes = _ordered(array("Q", chain.hashes)).tobytes()
    packed = Packed(
        record.replica, sent.backend_id, sent.slot, hashes, chain.length, chain.whole, sent.tokens,
        sent.session_key, sent.cached, sent.user_start, sent.gap, sent.first_user,
        (sent.head.length, sent.head.last_chunk, sent.head.whole) if sent.head is not None else None,
    )  # fmt: skip
    return msgspec.msgpack.encode(packed)


def unpack(raw: bytes) -> PromptRecord:
    p = msgspec.msgpack.decode(raw, type=Packed)
    chain = PromptChain(tuple(_ordered(array("Q", p.hashes))), p.length, p.whole)
    head = PromptMark(*p.head) if p.head is not None else None
    sent = SentPrompt(
        p.backend_id,
        p.slot,
        chain,
        p.tokens,
        p.session_key,
        p.cached,
        p.user_start,
        p.gap,
        p.first_user,
        head,
    )
    return PromptRecord(p.replica, sent)


def _ordered(values: array[int]) -> array[int]:
    """Hashes travel little-endian, whatever the machine."""
    if sys.byteorder != "little":
        values.byteswap()
    return values
