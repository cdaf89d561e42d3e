"""Prompts as content-addressed chains: growth keeps the prefix, layout does not matter, edits do."""

from __future__ import annotations

from typing import Any

from hypothesis import given
from hypothesis import strategies as st

from policies.prefix import CHUNK_BYTES, chain_of, render, render_completion

TURN1: list[dict[str, Any]] = [
    {"role": "system", "content": "You are a coding agent. " * 200},
    {"role": "user", "content": "Fix the failing test."},
]
TURN2 = [*TURN1, {"role": "assistant", "content": "Done: " + "x" * 3000}, {"role": "user", "content": "Now?"}]


def test_a_growing_conversation_extends_its_previous_prompt() -> None:
    first, second = chain_of(render(TURN1)), chain_of(render(TURN2))
    assert second.hashes[: first.chunks] == first.hashes
    assert second.extends(first.mark)
    assert not first.extends(second.mark)


def test_text_appended_to_the_last_message_extends_too() -> None:
    """Mooncake-style traces grow one user message; completions grow one prompt string."""
    short = chain_of(render([{"role": "user", "content": "a" * 5000}]))
    longer = chain_of(render([{"role": "user", "content": "a" * 5000 + "b" * 900}]))
    assert longer.extends(short.mark)
    assert chain_of(render_completion("abc" * 900)).chunks == 2


def test_an_edited_earlier_message_keeps_only_the_chunks_before_the_edit() -> None:
    edited = [TURN2[0], {"role": "user", "content": "Fix the failing test!"}, *TURN2[2:]]
    original, changed = chain_of(render(TURN2)), chain_of(render(edited))
    assert not changed.extends(original.mark)
    shared = len(render(TURN1[:1])) // CHUNK_BYTES
    assert changed.matched(frozenset(original.hashes)) == shared


def test_layout_does_not_matter_but_content_and_tools_do() -> None:
    plain = [{"role": "user", "content": "hello"}]
    parts = [{"content": [{"type": "text", "text": "hello"}], "role": "user"}]
    assert render(plain) == render(parts)
    assert render(plain) != render([{"role": "user", "content": "hello!"}])
    assert render(plain) != render(plain, tools=[{"function": {"name": "f"}}])


@given(st.binary(max_size=5000), st.binary(max_size=3000))
def test_any_byte_prefix_is_recognised(head: bytes, more: bytes) -> None:
    whole, start = chain_of(head + more), chain_of(head)
    assert whole.extends(start.mark)
    assert whole.matched(frozenset(start.hashes)) == start.chunks
