"""The prefix index: its memory (what docs/routing.md promises per tracked token), and the context
checkpoints it keeps per llama.cpp slot, held to the simulator's rules."""

from __future__ import annotations

import gc
import random
import tracemalloc

import pytest

from backends.sim.prefix_cache import MAX_CHECKPOINTS, SlotReuse, add_checkpoints, llama_reuse
from gateway.state.prefix_index import PrefixIndex, SentPrompt
from policies.checkpoints import DEFAULT_GAP
from policies.prefix import CHUNK_BYTES, chain_of
from policies.types import SlotMatch

CHARS_PER_TOKEN = 3.6


def test_a_tracked_token_costs_well_under_a_byte() -> None:
    """20 prompts of 100 kB (~28k tokens each) on two slots: measured ~0.3 byte per token; no text kept."""
    rng = random.Random(0)
    prompts = [rng.randbytes(100_000) for _ in range(20)]
    index = PrefixIndex(max_tokens_per_backend=10**9)
    gc.collect()
    tracemalloc.start()
    try:
        before = tracemalloc.take_snapshot()
        for number, prompt in enumerate(prompts):
            index.record(
                SentPrompt(
                    "llama", number % 2, chain_of(prompt), round(len(prompt) / CHARS_PER_TOKEN), f"s{number}"
                )
            )
        gc.collect()
        grown = sum(stat.size_diff for stat in tracemalloc.take_snapshot().compare_to(before, "filename"))
    finally:
        tracemalloc.stop()
    tokens = sum(len(p) for p in prompts) / CHARS_PER_TOKEN
    assert grown / tokens < 0.5
    assert grown < sum(len(p) for p in prompts) / 10  # hashes, not text
    assert grown / (len(prompts) * (100_000 // CHUNK_BYTES)) < 130  # bytes per chunk


# Context checkpoints. Prompts here are token lists, 4 bytes a token, so a 1 KiB chunk is 256 tokens
# and the index's byte-proportional token counts are exact.

SYSTEM_TOKENS = 2048


def encode(tokens: list[int]) -> bytes:
    return b"".join(token.to_bytes(4, "big") for token in tokens)


class Tokens:
    """Fresh token ids: two prompts built from them diverge exactly where they say."""

    def __init__(self) -> None:
        self.next = 1

    def take(self, count: int) -> list[int]:
        start, self.next = self.next, self.next + count
        return list(range(start, start + count))


class Engine:
    """One hybrid llama.cpp slot by the simulator's own rules (``LlamaEngine._launch`` and the
    slot keeping the prompt plus its answer but the last token), beside turnout's index of it."""

    def __init__(self, gap: int = DEFAULT_GAP) -> None:
        self.tokens: list[int] = []
        self.checkpoints: tuple[int, ...] = ()
        self.index = PrefixIndex()
        self.gap = gap  # the engine's micro-batch's: min(batch, 4 + ubatch)

    def send(self, prompt: list[int], answer: list[int]) -> SlotReuse:
        """The prompt runs on slot 0 and is recorded with the engine's cached count (and its gap)."""
        reuse = llama_reuse(self.tokens, self.checkpoints, prompt, hybrid=True)
        self.checkpoints = add_checkpoints(reuse.checkpoints, len(prompt), reuse.n_past, self.gap)
        self.tokens = prompt + answer[:-1]
        chain = chain_of(encode(prompt))
        self.index.record(SentPrompt("llama", 0, chain, len(prompt), "s", reuse.n_past, gap=self.gap))
        return reuse

    def match(self, prompt: list[int]) -> SlotMatch:
        return self.index.match(chain_of(encode(prompt)), "llama").slot(0)

    def held(self) -> tuple[int, ...]:
        return checkpoints(self.index)


def checkpoints(index: PrefixIndex) -> tuple[int, ...]:
    """What the index says slot 0 of "llama" can restore."""
    held = index.slot("llama", 0)
    return held.checkpoints if held is not None else ()


class TestCheckpoints:
    @pytest.mark.parametrize("gap", [DEFAULT_GAP, 2048], ids=["ubatch-512", "ubatch-2048"])
    def test_the_index_keeps_the_checkpoints_the_simulator_keeps(self, gap: int) -> None:
        """300 prompts on one slot (chats sharing a system prompt, follow-ups, edits inside the
        conversation, resends, unrelated prompts): after each, the index's checkpoints are the
        simulator's, and the one it offers a diverging prompt is never past what the engine restores;
        it is that one when the index sees the prompts share that much (it matches whole chunks). At
        llama-server's default micro-batch and at compose's 2,048, whose gap the record carries."""
        rng, fresh, engine = random.Random(3), Tokens(), Engine(gap)
        system = fresh.take(SYSTEM_TOKENS)
        prompt, answer = system + fresh.take(181), fresh.take(40)
        exact = longest = 0
        for _ in range(300):
            kind = rng.choices(["chat", "follow-up", "edit", "resend", "other"], [2, 24, 3, 1, 1])[0]
            if kind == "chat":
                prompt = system + fresh.take(rng.randint(50, 800))
            elif kind == "follow-up":
                prompt = prompt + answer + fresh.take(rng.randint(20, 900))
            elif kind == "edit":
                prompt = prompt[: rng.randint(1, len(prompt) - 1)] + fresh.take(rng.randint(1, 600))
            elif kind == "other":
                prompt = fresh.take(rng.randint(100, 3000))
            offered = engine.match(prompt)
            reuse = engine.send(prompt, answer := fresh.take(rng.randint(2, 300)))
            assert engine.held() == engine.checkpoints, kind
            if reuse.restored is not None and not offered.whole:
                assert offered.checkpoint <= reuse.restored
                if reuse.restored <= offered.tokens:
                    assert offered.checkpoint == reuse.restored
                    exact += 1
            longest = max(longest, len(engine.checkpoints))
        assert exact >= 30
        assert longest == MAX_CHECKPOINTS

    def test_a_short_chat_turn_leaves_a_checkpoint_past_the_system_prompt(self) -> None:
        """A 2229-token chat (2048 of system prompt) checkpoints the slot at 1713: every later chat
        sharing the system prompt restores it, as long as each reuses at least that much."""
        fresh, engine = Tokens(), Engine()
        system = fresh.take(SYSTEM_TOKENS)
        engine.send(system + fresh.take(181), fresh.take(40))
        assert engine.held() == (1713, 2225)
        for length in (3000, 5000, 4000):
            prompt = system + fresh.take(length)
            assert engine.match(prompt).checkpoint == 1713
            assert engine.send(prompt, fresh.take(40)).n_past == 1713
            assert engine.held() == (1713, length + 2048 - 516, length + 2048 - 4)

    def test_a_cold_conversation_leaves_its_system_prompt_for_the_next_session(self) -> None:
        """A cold prompt of several turns checkpoints where its first user message starts (the system
        prompt's end: tests/real/test_llama_first_user_checkpoint_contract.py); a new session sharing
        the system prompt is offered it, and the record's first user start is what places it."""
        fresh, index = Tokens(), PrefixIndex()
        system = fresh.take(SYSTEM_TOKENS)
        conversation = system + fresh.take(6000)
        sent = SentPrompt("llama", 0, chain_of(encode(conversation)), 8048, "a", 0, 7900, first_user=2048)
        index.record(sent)
        assert checkpoints(index) == (2048, 8048 - 516, 7900, 8048 - 4)
        chat = system + fresh.take(700)
        assert index.match(chain_of(encode(chat)), "llama").slot(0).checkpoint == 2048
        index.record(SentPrompt("llama", 0, chain_of(encode(chat)), 2748, "b", 2048, first_user=2048))
        assert checkpoints(index) == (2048, 2748 - 516, 2748 - 4)  # a warm prompt: none taken again

    def test_the_system_prompt_checkpoint_is_offered_past_the_whole_chunks_shared(self) -> None:
        """Two sessions on one system prompt part right after it, so the whole 1 KiB chunks they
        share end before the checkpoint a cold prompt took at its first user message; the record's
        head (its bytes up to there) says the new prompt has them all, and the slot offers it."""
        system = bytes(range(256)) * 19 + b"tools"  # 4,869 bytes: not a whole number of chunks
        conversation = system + b"u" * 20_000
        chain = chain_of(conversation)
        head = chain.mark_at(len(system))
        assert head is not None
        first, tokens = len(system) // 4, len(conversation) // 4
        index = PrefixIndex()
        sent = SentPrompt("llama", 0, chain, tokens, "a", 0, tokens - 50, first_user=first, head=head)
        index.record(sent)
        assert first in checkpoints(index)
        newcomer = chain_of(system + b"v" * 2_000)
        assert index.match(newcomer, "llama").slot(0).checkpoint == first
        other = chain_of(system[:-1] + b"X" + b"v" * 2_000)  # another tool list: not the same head
        assert index.match(other, "llama").slot(0).checkpoint < first
        headless = PrefixIndex()
        headless.record(SentPrompt("llama", 0, chain, tokens, "a", 0, tokens - 50, first_user=first))
        assert headless.match(newcomer, "llama").slot(0).checkpoint < first  # what it offered before
        later = chain_of(
            conversation + b"w" * 4_000
        )  # the session goes on: the checkpoint stays, and its head
        index.record(
            SentPrompt("llama", 0, later, tokens + 1000, "a", tokens - 4, first_user=first, head=head)
        )
        assert index.match(newcomer, "llama").slot(0).checkpoint == first

    def test_a_prompt_that_shares_nothing_erases_them(self) -> None:
        fresh, engine = Tokens(), Engine()
        system = fresh.take(SYSTEM_TOKENS)
        engine.send(system + fresh.take(181), fresh.take(40))
        engine.send(fresh.take(3000), fresh.take(40))
        assert engine.held() == engine.checkpoints == (3000 - 516, 3000 - 4)
        assert engine.match(system + fresh.take(500)).checkpoint == 0

    def test_an_unknown_cached_count_keeps_only_the_prompts_own(self) -> None:
        """An engine that did not say what it reused: the older checkpoints may be gone."""
        fresh, index = Tokens(), PrefixIndex()
        system = fresh.take(SYSTEM_TOKENS)
        index.record(SentPrompt("llama", 0, chain_of(encode(system + fresh.take(181))), 2229, "a", 0))
        index.record(SentPrompt("llama", 0, chain_of(encode(system + fresh.take(1000))), 3048, "b"))
        assert checkpoints(index) == (3048 - 516, 3048 - 4)

    def test_a_state_loaded_from_the_ram_cache_keeps_none_of_the_old_ones(self) -> None:
        """A prompt that reused more than it shares with the slot's last prompt got another state
        (llama-server loaded it from its RAM cache), with checkpoints turnout does not know."""
        fresh, index = Tokens(), PrefixIndex()
        system, mine = fresh.take(SYSTEM_TOKENS), fresh.take(6000)
        index.record(SentPrompt("llama", 0, chain_of(encode(system + mine)), 8048, "a", 0))
        index.record(SentPrompt("llama", 0, chain_of(encode(system + fresh.take(181))), 2229, "b", 0))
        index.record(
            SentPrompt("llama", 0, chain_of(encode(system + mine + fresh.take(300))), 8348, "a", 7532)
        )
        assert checkpoints(index) == (8348 - 516, 8348 - 4)

    def test_only_slots_hold_checkpoints(self) -> None:
        """A recent prompt (a RAM cache entry) offers none: its checkpoints are not tracked."""
        fresh, index = Tokens(), PrefixIndex()
        system = fresh.take(SYSTEM_TOKENS)
        index.record(SentPrompt("vllm", None, chain_of(encode(system + fresh.take(181))), 2229, None, 0))
        match = index.match(chain_of(encode(system + fresh.take(900))), "vllm")
        assert match.slots == ()
        assert match.best_recent.checkpoint == 0


def test_another_replicas_prompt_on_a_slot_settles_what_it_held() -> None:
    """A prompt another replica sent (its launches unseen here) goes to the RAM cache's view at once,
    and settles the slot's pending prompt as this replica's own would: b reused a's slot as it is
    (the same long system prompt), so a's was never saved."""
    system = b"you are a careful coding agent. " * 200
    a, b = system + b"the first task " * 100, system + b"another task " * 100
    index = PrefixIndex()
    index.record(SentPrompt("llama", 0, chain_of(a), 2000, "a"))
    index.record(SentPrompt("llama", 0, chain_of(b), 2000, "b"), seen=False)
    index.launched("llama", 1, chain_of(b"z" * 5000), 1400)
    assert index.match(chain_of(a + b" next"), "llama").recent < 2000
    assert index.match(chain_of(b + b" next"), "llama").recent == 2000
