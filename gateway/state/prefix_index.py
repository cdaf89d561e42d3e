"""The content-addressed prefix index: what turnout sent to each backend, slot and RAM cache.

Every finished request records its prompt's chain (``policies.prefix``: chained 64-bit hashes of
1 KiB chunks of the canonical prompt, no text) with the engine's token count:

- ``recent[backend]``: the prompts sent to the backend lately, newest last, a prompt that extends an
  older one replacing it; bounded by ``max_tokens`` per backend (oldest out first). For llama.cpp
  this is what its RAM prompt cache may hold (a slot's prompt once saved there: ``pending``), for
  vLLM what its prefix cache may hold. ``chunks[backend]`` counts each hash over those prompts, so the longest
  held prefix of a new prompt is a binary search over its chain (chains are prefix-closed).
- ``slots[backend][slot]``: the prompt last pinned to that llama.cpp slot, with the context
  checkpoints a hybrid slot holds (``Held.checkpoints``), rebuilt by llama-server's rules
  (``policies.slot_rules.checkpoints_after``) from each recorded prompt's token count and the engine's
  ``cached`` count: checkpoints an earlier prompt left stay while later prompts reuse at least that
  much, so a slot that held a short chat turn still restores the checkpoint just past the shared
  system prompt. Turnout does not know what a slot loaded from the RAM cache holds: a prompt that
  reused more than it shares with the slot's previous prompt, or whose ``cached`` is unknown, keeps
  only its own.
- ``pending[backend][slot]``: an idle llama.cpp slot's prompt that nothing has saved to the RAM cache
  yet. llama-server saves every idle slot when a task starts (``--cache-idle-slots``, its default),
  and a slot that a prompt sharing little with it takes (``policies.slot_rules.consults_ram``). So a
  prompt joins ``recent`` at the next launch on another slot of its backend (``launched``), or when
  a prompt that consults the RAM cache takes its slot; one that the next prompt on its slot reuses as
  it is (another session on the same long system prompt, or its own next turn) was never saved, and
  is not expected in the RAM cache. Whether the prompt that takes a slot saved its prompt is judged
  when that one is recorded (``_saved_by``). Another replica's record resolves the slot's pending
  prompt so too, and goes to ``recent`` at once (``record``'s ``seen``): its launches are not seen.
  Approximations: a launch is counted when turnout routes the request (a task that waits for a busy
  slot, or that the server refuses, starts later or never); a warm-up's prompt is recorded as it
  starts; and a slot's prompt stays pending while the next task there runs, so a launch elsewhere
  meanwhile counts it saved, which llama-server does not do to a busy slot. Judging the takeover at
  its launch instead, which gets that right, failed the validation set (val-copilot's p90 +2.3%;
  docs/benchmarks.md, twenty-fifth entry).
- ``tips``: each recorded prompt's mark under its last full chunk, with its session: a request that
  extends a known prompt byte for byte continues that session (implicit sessions are this view).

Memory: a tracked prompt costs about 90 bytes per 1 KiB chunk (its hash in the chain tuple, the
hash's int, a counter entry), about 0.3 bytes per tracked token at ~3.6 characters per token, per
backend it was sent to (``tests/gateway/test_prefix_index.py`` measures it); ``max_tokens`` bounds it.
"""

from __future__ import annotations

from collections import OrderedDict
from dataclasses import dataclass

import msgspec

from policies.checkpoints import DEFAULT_GAP
from policies.prefix import CHUNK_BYTES, PromptChain, PromptMark
from policies.slot_rules import SIMILARITY_THRESHOLD, checkpoints_after, consults_ram_by_counts
from policies.types import PrefixMatch, SlotMatch

ROOT = -1  # the tip key of prompts shorter than one chunk
LONGER = 1 << 40  # the held size of a match that ends inside some longer prompt
TIPS_PER_KEY = 8


@dataclass(frozen=True, slots=True)
class SentPrompt:
    """A prompt an engine just processed: on ``backend_id`` (pinned to ``slot`` on llama.cpp), its
    ``chain``, ``tokens`` long by the engine's count, for ``session_key``, ``cached`` of its tokens
    reused (None: the engine did not say)."""

    backend_id: str
    slot: int | None
    chain: PromptChain
    tokens: int
    session_key: str | None = None
    cached: int | None = None
    user_start: int = -1
    """Where its last user message starts, in tokens (the engine checkpoints it; -1: none)."""
    gap: int = DEFAULT_GAP
    """How far before its end the engine took its first near-end checkpoint
    (``policies.slot_rules.checkpoint_gap``)."""
    first_user: int = -1
    """Where its first user message starts (the engine checkpoints it on a cold prompt; -1: none)."""
    head: PromptMark | None = None
    """Its bytes up to that first user message (``RequestFeatures.head``)."""


class Held(msgspec.Struct, frozen=True):
    """One prompt turnout sent: its chain, its byte length and the engine's token count; on a slot,
    the checkpoints (token offsets, oldest first) the slot can restore."""

    hashes: tuple[int, ...]
    mark: PromptMark
    tokens: int
    checkpoints: tuple[int, ...] = ()
    head: PromptMark | None = None
    """On a slot: the prompt's bytes up to its first user message, where the slot holds a checkpoint
    (``head_at``): a prompt with the same head restores it, though the whole chunks it shares end
    before it (two sessions on one system prompt part right after it)."""
    head_at: int = 0

    def tokens_for(self, chunks: int) -> int:
        """Tokens of this prompt's first ``chunks`` chunks (proportional to bytes)."""
        if not self.mark.length:
            return 0
        return min(self.tokens, round(self.tokens * chunks * CHUNK_BYTES / self.mark.length))

    def checkpoint_at(self, tokens: int) -> int:
        """The newest checkpoint at or below ``tokens`` (0: none)."""
        return max((c for c in self.checkpoints if c <= tokens), default=0)

    def survivors(self, chain: PromptChain, cached: int | None) -> tuple[int, ...]:
        """The checkpoints that may survive ``chain`` pinned to this prompt's slot, ``cached`` reused:
        none when ``cached`` is unknown, or more than the two prompts share (the slot loaded another
        state from the RAM cache, with checkpoints turnout does not know)."""
        if cached is None:
            return ()
        if not chain.extends(self.mark) and cached > self.tokens_for(chain.common(self.hashes) + 1):
            return ()
        return self.checkpoints


class _Recent:
    """One backend's recent prompts (LRU by whole prompt) and the counts of their hashes."""

    def __init__(self, max_tokens: int) -> None:
        self.max_tokens = max_tokens
        self.prompts: OrderedDict[int, Held] = OrderedDict()
        self.chunks: dict[int, int] = {}
        self.tokens = 0
        self.bytes = 0
        self.clock = 0  # tokens recorded so far: a prompt's age is the tokens recorded after it
        self.added: dict[int, int] = {}
        self.by_last: dict[
            int, dict[int, None]
        ] = {}  # last full chunk -> digests of the prompts ending there

    def add(self, held: Held, chain: PromptChain) -> None:
        self.clock += held.tokens
        if held.mark.whole in self.prompts:
            self.prompts.move_to_end(held.mark.whole)
            self.added[held.mark.whole] = self.clock
            return
        for chunk in (ROOT, *held.hashes):  # an older prompt this one extends is obsolete
            for whole in list(self.by_last.get(chunk, ())):
                if chain.extends(self.prompts[whole].mark):
                    self._drop(whole)
        self.prompts[held.mark.whole] = held
        self.added[held.mark.whole] = self.clock
        self.tokens += held.tokens
        self.bytes += held.mark.length
        for chunk in held.hashes:
            self.chunks[chunk] = self.chunks.get(chunk, 0) + 1
        self.by_last.setdefault(held.hashes[-1] if held.hashes else ROOT, {})[held.mark.whole] = None
        while self.tokens > self.max_tokens and len(self.prompts) > 1:
            self._drop(next(iter(self.prompts)))

    def _drop(self, whole: int) -> None:
        held = self.prompts.pop(whole)
        del self.added[whole]
        self.tokens -= held.tokens
        self.bytes -= held.mark.length
        for chunk in held.hashes:
            left = self.chunks[chunk] - 1
            if left:
                self.chunks[chunk] = left
            else:
                del self.chunks[chunk]
        last = held.hashes[-1] if held.hashes else ROOT
        owners = self.by_last[last]
        del owners[whole]
        if not owners:
            del self.by_last[last]

    def match(self, chain: PromptChain) -> tuple[SlotMatch, int]:
        """``chain``'s longest prefix among these prompts (tokens), the prompt it belongs to, and
        that prompt's age (tokens recorded since; 0 when the prefix lies inside a longer prompt)."""
        chunks = chain.matched(self.chunks)
        owners = [
            self.prompts[w]
            for w in reversed(self.by_last.get(chain.hashes[chunks - 1] if chunks else ROOT, {}))
        ]
        whole = next((held for held in owners if chain.extends(held.mark)), None)
        if whole is not None:
            return SlotMatch(-1, whole.tokens, whole=True, held=whole.tokens), self._age(whole)
        if owners:
            return SlotMatch(-1, owners[0].tokens_for(chunks), held=owners[0].tokens), self._age(owners[0])
        if not chunks:
            return SlotMatch(-1, 0), 0
        tokens = min(chain.length, chunks * CHUNK_BYTES) * self.tokens // max(self.bytes, 1)
        return SlotMatch(-1, tokens, held=LONGER), 0  # inside a longer prompt, far from its checkpoints

    def _age(self, held: Held) -> int:
        return self.clock - self.added[held.mark.whole]


class PrefixIndex:
    """Recent prompts per backend, llama.cpp slot contents, and session tips (module docstring)."""

    def __init__(self, *, max_tokens_per_backend: int = 1_000_000, max_tips: int = 40_000) -> None:
        self.max_tokens = max_tokens_per_backend
        self.max_tips = max_tips
        self._recent: dict[str, _Recent] = {}
        self._slots: dict[str, dict[int, Held]] = {}
        self._pending: dict[str, dict[int, tuple[Held, PromptChain]]] = {}
        self._tips: OrderedDict[int, list[tuple[PromptMark, str]]] = OrderedDict()

    def record(self, sent: SentPrompt, *, seen: bool = True) -> None:
        """The sent prompt's chain now sits on its backend (and slot, with the checkpoints the
        engine's rules leave it), and continues its session. ``seen``: this replica routes the
        launches on its backend; another replica's record (False) goes to ``recent`` at once, as
        the RAM cache may hold it, since its launches are not seen here."""
        backend_id, slot, chain, tokens = sent.backend_id, sent.slot, sent.chain, sent.tokens
        session, cached = sent.session_key, sent.cached
        held = Held(chain.hashes, chain.mark, tokens)
        recent = self._recent.setdefault(backend_id, _Recent(self.max_tokens))
        if slot is None:
            recent.add(held, chain)
        else:  # this prompt took the slot: was the one it held saved first? (``_saved_by``)
            pending = self._pending.setdefault(backend_id, {})
            prior = pending.pop(slot, None)
            if prior is not None and _saved_by(chain, tokens, prior[0]):
                recent.add(*prior)
            if seen:
                pending[slot] = (held, chain)
            else:
                recent.add(held, chain)
            slots = self._slots.setdefault(backend_id, {})
            previous = slots.get(slot)
            kept = previous.survivors(chain, cached) if previous is not None else ()
            checkpoints = checkpoints_after(kept, tokens, cached, sent.gap, sent.user_start, sent.first_user)
            head, head_at = _head(sent, previous, checkpoints)
            slots[slot] = Held(chain.hashes, chain.mark, tokens, checkpoints, head, head_at)
        if session is not None:
            key = chain.hashes[-1] if chain.hashes else ROOT
            tips = [(mark, owner) for mark, owner in self._tips.pop(key, []) if mark.whole != chain.whole]
            self._tips[key] = [(chain.mark, session), *tips][:TIPS_PER_KEY]
            while len(self._tips) > self.max_tips:
                self._tips.popitem(last=False)

    def forget(self, backend_id: str) -> None:
        """The backend restarted: none of its slots or caches hold anything any more."""
        self._recent.pop(backend_id, None)
        self._slots.pop(backend_id, None)
        self._pending.pop(backend_id, None)

    def launched(self, backend_id: str, slot: int | None, chain: PromptChain, tokens: int) -> None:
        """A task of ``chain`` (``tokens`` long) starts on ``backend_id``, pinned to ``slot`` (None:
        llama-server gives it the idle slot most similar to it, else the least recently used one):
        every other slot's pending prompt is saved now (module docstring, ``pending``); the one it
        takes is judged when it is recorded (``record``)."""
        pending = self._pending.get(backend_id)
        if not pending:
            return
        recent = self._recent.setdefault(backend_id, _Recent(self.max_tokens))
        taken = slot if slot is not None else _similar(pending, chain, tokens)
        for other in [s for s in pending if s != taken]:
            recent.add(*pending.pop(other))

    def slot(self, backend_id: str, slot: int) -> Held | None:
        """What turnout last pinned to ``slot`` of ``backend_id``, with its checkpoints."""
        return self._slots.get(backend_id, {}).get(slot)

    def match(self, chain: PromptChain, backend_id: str) -> PrefixMatch:
        """What ``backend_id`` holds of ``chain``: per slot (with the newest checkpoint within the
        shared prefix), and among its recent prompts."""
        recent = self._recent.get(backend_id)
        slots = []
        for slot, held in sorted(self._slots.get(backend_id, {}).items()):
            whole = chain.extends(held.mark)
            tokens = held.tokens if whole else held.tokens_for(chain.common(held.hashes))
            at = held.checkpoint_at(tokens)
            if not whole and held.head is not None and held.head_at > at and chain.extends(held.head):
                tokens, at = max(tokens, held.head_at), held.head_at  # the same system prompt: its checkpoint
            slots.append(SlotMatch(slot, tokens, whole, held.tokens, at, len(held.checkpoints)))
        best, age = recent.match(chain) if recent else (SlotMatch(-1, 0), 0)
        return PrefixMatch(tuple(slots), best.tokens, best.whole, best.held, age)

    def find_session(self, chain: PromptChain) -> str | None:
        """The session whose recorded prompt is the longest byte prefix of ``chain`` shorter than it,
        if any: a prompt that only repeats a recorded one continues nothing (ten clients sending the
        same "Hello!" are ten conversations, not one of ten turns)."""
        for index in range(chain.chunks - 1, -2, -1):
            key = chain.hashes[index] if index >= 0 else ROOT
            for mark, session in self._tips.get(key, ()):
                if mark.length < chain.length and chain.extends(mark):
                    return session
        return None


def _saved_by(chain: PromptChain, tokens: int, prior: Held) -> bool:
    """Whether llama-server saved a slot's ``prior`` prompt before ``chain`` (``tokens`` long) took
    the slot: it does when the two share little (``consults_ram``), not when ``chain`` reuses the slot
    as it is (it continues ``prior``, or shares a long system prompt with it)."""
    if chain.extends(prior.mark):
        return False
    shared = prior.tokens_for(chain.common(prior.hashes))
    return consults_ram_by_counts(shared, tokens, prior.tokens)


def _head(
    sent: SentPrompt, previous: Held | None, checkpoints: tuple[int, ...]
) -> tuple[PromptMark | None, int]:
    """The slot's checkpoint at a first user message and that prompt's head, after ``sent``: the one
    ``sent`` took (a cold prompt), else the previous one if it survived and ``sent`` has that head."""
    if sent.head is not None and sent.first_user in checkpoints and (sent.cached or 0) < sent.first_user:
        return sent.head, sent.first_user
    if previous is None or previous.head is None:
        return None, 0
    if previous.head_at in checkpoints and sent.chain.extends(previous.head):
        return previous.head, previous.head_at
    return None, 0


def _similar(pending: dict[int, tuple[Held, PromptChain]], chain: PromptChain, tokens: int) -> int | None:
    """The idle slot llama-server gives an unpinned task by similarity, among those whose prompt is
    not saved yet: the most tokens shared with ``chain``, above ``SIMILARITY_THRESHOLD`` of it."""
    shared = {slot: held.tokens_for(chain.common(held.hashes)) for slot, (held, _) in pending.items()}
    best = max(shared, key=lambda slot: shared[slot], default=None)
    return best if best is not None and shared[best] > SIMILARITY_THRESHOLD * tokens else None
