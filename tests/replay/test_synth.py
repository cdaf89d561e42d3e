"""Prompt synthesis: exact block sizes under the simulators' tokenizer, equal ids -> equal text."""

from __future__ import annotations

from hypothesis import given
from hypothesis import strategies as st

from backends.sim import tokenizer
from backends.sim.chat import render_chat
from backends.sim.requests import user_starts as rendered_user_starts
from gateway.replay.synth import (
    CHAT_TAIL,
    block_text,
    block_tokens,
    prompt_text,
    prompt_tokens,
    request_messages,
    template_tokens,
    text_tokens,
    threaded,
    user_starts,
)
from gateway.replay.traces import TraceRequest


def request(tokens: int, ids: tuple[int, ...], session: str | None = None) -> TraceRequest:
    return TraceRequest(0.0, session, "m", tokens, ids, 8)


class TestSynth:
    def test_a_block_is_512_tokens_and_deterministic(self) -> None:
        for block_id in (0, 1, 977, 123456):
            assert tokenizer.count(block_text(block_id)) == 512
        assert tokenizer.count(block_text(5, 51)) == 51
        assert block_text(7) == block_text(7)
        assert block_text(7) != block_text(8)

    def test_prompt_has_the_requested_tokens(self) -> None:
        assert tokenizer.count(prompt_text(request(1300, (4, 5, 6)))) == 1300
        assert tokenizer.count(prompt_text(request(1536, (4, 5, 6)))) == 1536

    def test_growing_conversation_is_a_token_prefix_extension(self) -> None:
        """Turn 2 (more blocks, the partial last block completed) starts with turn 1's tokens."""
        first = tokenizer.encode(prompt_text(request(1300, (1, 2, 3))))
        second = tokenizer.encode(prompt_text(request(2100, (1, 2, 3, 9, 10))))
        assert second[: len(first)] == first

    def test_shared_leading_ids_share_text(self) -> None:
        a = prompt_text(request(1024, (0, 1)))
        b = prompt_text(request(1024, (0, 2)))
        assert a[: len(block_text(0))] == b[: len(block_text(0))]
        assert a != b

    def test_one_user_message_unless_messages_are_given(self) -> None:
        assert request_messages(request(10, (1,))) == [
            {"role": "user", "content": prompt_text(request(10, (1,)))}
        ]
        literal = TraceRequest(0.0, None, "m", 0, (), 8, ({"role": "user", "content": "hi"},))
        assert request_messages(literal) == [{"role": "user", "content": "hi"}]


@given(
    ids=st.lists(st.integers(0, 10**6), min_size=1, max_size=4),
    cut=st.integers(1, 64),
    block=st.sampled_from([16, 64]),
)
def test_the_engine_tokens_are_the_tokenized_chat(ids: list[int], cut: int, block: int) -> None:
    """What a virtual-time replay hands the engine models without tokenizing is exactly what a
    simulator makes of the chat request (template included)."""
    r = TraceRequest(0.0, None, "m", block * (len(ids) - 1) + min(cut, block), tuple(ids), 8)
    assert prompt_tokens(r, block) == tokenizer.encode(render_chat(request_messages(r, block)))
    assert list(block_tokens(ids[0], block)) == tokenizer.encode(block_text(ids[0], block))


class TestThreaded:
    """A conversation's turns as a chat client sends them: each turn that goes on from the previous
    one resends its messages, the previous answer and the new text as a user message."""

    TURNS = (
        request(1300, (1, 2, 3), "s"),
        request(2100, (1, 2, 3, 9, 10), "s"),
        request(2500, (1, 2, 3, 9, 10), "s"),
    )

    def test_each_turn_extends_the_previous_prompt_generation_prompt_included(self) -> None:
        """Sent as one growing user message, turn 2 diverged where turn 1's template tail began (the
        simulators' tail is 7 tokens, a real Qwen tokenizer's 5); threaded, it starts with every
        token of turn 1's prompt."""
        first, second, third = (prompt_tokens(r) for r in threaded(self.TURNS))
        assert second[: len(first)] == first
        assert third[: len(second)] == second
        one, two = prompt_tokens(self.TURNS[0]), prompt_tokens(self.TURNS[1])
        diverged = next(i for i, (a, b) in enumerate(zip(one, two, strict=False)) if a != b)
        assert len(one) - diverged == len(CHAT_TAIL) == 7  # the old way: the tail is rewritten

    def test_messages_alternate_and_the_answer_takes_the_previous_turns_max_tokens(self) -> None:
        turns = threaded(self.TURNS)
        assert turns[0].splits == ()
        assert turns[1].splits == (1300, 1308)  # the answer: max_tokens (8) of turn 1
        assert turns[2].splits == (1300, 1308, 2100, 2108)
        messages = request_messages(turns[2])
        assert [m["role"] for m in messages] == ["user", "assistant", "user", "assistant", "user"]
        assert [tokenizer.count(m["content"]) for m in messages] == [1300, 8, 792, 8, 392]
        assert "".join(m["content"] for m in messages) == prompt_text(turns[2])

    def test_the_answer_leaves_the_new_user_message_a_token(self) -> None:
        short = threaded((request(1300, (1, 2, 3), "s"), request(1305, (1, 2, 3), "s")))
        assert short[1].splits == (1300, 1304)
        same = threaded((request(1300, (1, 2, 3), "s"), request(1300, (1, 2, 3), "s")))
        assert same[1].splits == ()  # nothing new: one user message, as it was

    def test_a_turn_that_does_not_go_on_is_one_user_message(self) -> None:
        other = threaded((request(1300, (1, 2, 3), "s"), request(2100, (1, 7, 3, 9, 10), "s")))
        assert other[1].splits == ()
        shorter = threaded((request(2100, (1, 2, 3, 9, 10), "s"), request(1300, (1, 2, 3), "s")))
        assert shorter[1].splits == ()
        literal = TraceRequest(0.0, "s", "m", 0, (), 8, ({"role": "user", "content": "hi"},))
        assert threaded((self.TURNS[0], literal))[1] == literal

    def test_session_less_turns_are_threaded_by_content(self) -> None:
        """``traces.conversations`` links a turn whose ids start with all of an earlier one's."""
        turns = threaded(tuple(request(r.input_tokens, r.hash_ids) for r in self.TURNS))
        assert turns[2].splits == (1300, 1308, 2100, 2108)

    def test_a_repeat_or_a_rewritten_last_message_resends_the_earlier_messages(self) -> None:
        """A turn that shares the previous one's text up to its last user message keeps the previous
        turn's messages: a repeat sends the same prompt again; a rewrite of the last message diverges
        only there."""
        first, second = self.TURNS[:2]
        again = threaded((first, second, second))
        assert again[2].splits == again[1].splits
        assert prompt_tokens(again[2]) == prompt_tokens(again[1])
        rewritten = request(2100, (1, 2, 3, 9, 77), "s")  # the last user message's second block differs
        edited = threaded((first, second, rewritten))
        assert edited[2].splits == edited[1].splits == (1300, 1308)
        one, two = prompt_tokens(edited[1]), prompt_tokens(edited[2])
        diverged = next(i for i, (a, b) in enumerate(zip(one, two, strict=True)) if a != b)
        assert diverged > 1308 + 3 + 3 + 5 + 2  # inside the last user message
        earlier = threaded((first, second, request(1300, (1, 2, 3), "s")))
        assert earlier[2].splits == ()  # back before the answer: one user message

    def test_threading_twice_changes_nothing(self) -> None:
        once = threaded(self.TURNS)
        assert threaded(once) == once


@given(
    ids=st.lists(st.integers(0, 10**6), min_size=1, max_size=5),
    cuts=st.lists(st.integers(1, 40), min_size=1, max_size=4),
    answers=st.lists(st.integers(1, 30), min_size=4, max_size=4),
    block=st.sampled_from([16, 64]),
)
def test_threaded_turns_are_the_tokenized_chat(
    ids: list[int], cuts: list[int], answers: list[int], block: int
) -> None:
    """For every threaded turn: the engine tokens are the tokenized chat, the user messages start
    where the simulators find them, the template is what the tokens add to the text, and the turn
    extends the previous one's prompt."""
    total = block * len(ids)
    ends = sorted({min(c * len(ids), total) for c in cuts} | {total})
    turns = [
        TraceRequest(0.0, "s", "m", end, tuple(ids[: -(-end // block)]), answers[k % 4])
        for k, end in enumerate(ends)
    ]
    previous: list[int] = []
    messages_before = 1
    for r in threaded(turns, block):
        messages = request_messages(r, block)
        tokens = prompt_tokens(r, block)
        assert tokens == tokenizer.encode(render_chat(messages))
        assert user_starts(r) == rendered_user_starts(messages, None)
        assert len(tokens) == text_tokens(r, block) + template_tokens(r)
        if len(r.splits) + 1 > messages_before:  # it went on from the previous turn
            assert tokens[: len(previous)] == previous
        previous, messages_before = tokens, len(r.splits) + 1
