"""Prompt synthesis: exact block sizes under the simulators' tokenizer, equal ids -> equal text."""

from __future__ import annotations

from hypothesis import given
from hypothesis import strategies as st

from backends.sim import tokenizer
from backends.sim.chat import render_chat
from gateway.replay.synth import block_text, block_tokens, prompt_text, prompt_tokens, request_messages
from gateway.replay.traces import TraceRequest


def request(tokens: int, ids: tuple[int, ...]) -> TraceRequest:
    return TraceRequest(0.0, None, "m", tokens, ids, 8)


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
