"""Properties of the canonical prompt (``policies.prefix``) and its shape (``policies.shape``) that
implicit sessions rely on: the same conversation always gives the same chain, a conversation that
grows keeps its previous chain as a prefix, and the representations the module docstrings call
equivalent render to the same bytes."""

from __future__ import annotations

from typing import Any

from hypothesis import assume, given
from hypothesis import strategies as st

from policies.prefix import CHUNK_BYTES, PromptChain, chain_of, render, render_completion
from policies.shape import PIECE_CHARS, shape_of, where_it_breaks

texts = st.text(max_size=40) | st.builds(
    lambda n, tail: "x" * n + tail, st.integers(0, 2500), st.text(max_size=8)
)
roles = st.sampled_from(["system", "developer", "user", "assistant", "tool"])
calls = st.lists(
    st.fixed_dictionaries(
        {"id": st.text(max_size=4), "type": st.just("function"),
         "function": st.fixed_dictionaries({"name": st.text(max_size=6), "arguments": st.text(max_size=20)})}
    ),
    max_size=2,
)  # fmt: skip


@st.composite
def messages(draw: st.DrawFn, role: str | None = None) -> dict[str, Any]:
    message: dict[str, Any] = {"role": role or draw(roles), "content": draw(texts)}
    if message["role"] == "assistant" and draw(st.booleans()):
        message["tool_calls"] = draw(calls)
    if message["role"] == "tool":
        message["tool_call_id"] = draw(st.text(max_size=6))
    return message


conversations = st.lists(messages(), max_size=6)
tools = st.none() | st.lists(
    st.fixed_dictionaries({"type": st.just("function"), "function": st.fixed_dictionaries(
        {"name": st.text(max_size=6), "description": st.text(max_size=20),
         "parameters": st.dictionaries(st.text(max_size=4), st.integers(), max_size=2)})}),
    max_size=2,
)  # fmt: skip


def chain(conversation: list[Any], tool_list: Any = None) -> PromptChain:
    return chain_of(render(conversation, tool_list))


@given(conversations, tools)
def test_the_same_conversation_always_gives_the_same_chain(conversation: list[Any], tool_list: Any) -> None:
    """Also with every object's keys in another order (a client serialises as it likes)."""
    reordered = [dict(reversed(m.items())) for m in conversation]
    assert chain(conversation, tool_list) == chain(reordered, tool_list)
    assert chain(conversation, tool_list).hashes == chain(conversation, tool_list).hashes


@given(conversations, st.lists(messages(), min_size=1, max_size=3), tools)
def test_a_conversation_extended_by_messages_extends_its_chain(
    conversation: list[Any], more: list[Any], tool_list: Any
) -> None:
    before, after = chain(conversation, tool_list), chain([*conversation, *more], tool_list)
    assert after.extends(before.mark)
    assert after.hashes[: before.chunks] == before.hashes
    assert after.matched(frozenset(before.hashes)) == before.chunks
    hashes_only = PromptChain(after.hashes, after.length, after.whole)  # another replica's record
    assert hashes_only.extends(before.mark)


@given(conversations, messages(), texts)
def test_text_appended_to_the_last_message_extends_its_chain(
    conversation: list[Any], last: dict[str, Any], appended: str
) -> None:
    """Mooncake-style traces grow the last message; its tool calls and tool call id (rendered after
    its text) are not part of this claim, so the last message here has none."""
    last = {"role": last["role"], "content": last["content"]}
    longer = {**last, "content": last["content"] + appended}
    assert chain([*conversation, longer]).extends(chain([*conversation, last]).mark)


@given(texts, texts)
def test_a_completion_prompt_that_grows_extends_its_chain(prompt: str, appended: str) -> None:
    assert chain_of(render_completion(prompt + appended)).extends(chain_of(render_completion(prompt)).mark)
    assert render_completion([prompt]) == render_completion(prompt)


@given(roles, st.lists(texts, min_size=1, max_size=3), st.sampled_from(["text", "input_text", "output_text"]))
def test_content_as_a_string_or_as_blocks_renders_alike(role: str, pieces: list[str], kind: str) -> None:
    """OpenAI text parts, Responses input/output text, bare strings in a list and a string with the
    pieces joined by newlines are one content."""
    joined = "\n".join(pieces)
    forms = [
        joined,
        [{"type": kind, "text": p} for p in pieces],
        list(pieces),
        [{"text": p, "type": kind, "cache_control": {"type": "ephemeral"}} for p in pieces],
    ]
    rendered = {render([{"role": role, "content": form}]) for form in forms}
    assert len(rendered) == 1


@given(texts, st.text(max_size=6))
def test_a_tool_result_as_text_or_as_blocks_renders_alike(result: str, call_id: str) -> None:
    """Anthropic's ``tool_result`` holds a string or text blocks."""
    as_string = [{"type": "tool_result", "tool_use_id": call_id, "content": result}]
    as_blocks = [
        {"type": "tool_result", "tool_use_id": call_id, "content": [{"type": "text", "text": result}]}
    ]
    assert render([{"role": "user", "content": as_string}]) == render(
        [{"role": "user", "content": as_blocks}]
    )


@given(messages(), st.sampled_from(["name", "cache_control", "refusal", "annotations"]), st.text(max_size=5))
def test_fields_outside_the_canonical_form_do_not_count(
    message: dict[str, Any], key: str, value: str
) -> None:
    """The canonical form is role, text, tool calls and tool call id: nothing else changes a chain."""
    assert render([{**message, key: value}]) == render([message])


@given(roles)
def test_empty_fields_add_nothing(role: str) -> None:
    empty = [{"role": role, "content": c} for c in ("", None, [])]
    empty += [{"role": role, "content": "", "tool_calls": []}, {"role": role, "tool_call_id": ""}]
    assert len({render([m]) for m in empty}) == 1


@given(
    st.text(max_size=6), st.text(max_size=20), st.dictionaries(st.text(max_size=4), st.integers(), max_size=2)
)
def test_a_function_tool_nested_or_flat_renders_alike(
    name: str, description: str, parameters: dict[str, int]
) -> None:
    """Chat's ``{"function": {...}}`` and the Responses API's flat function tool."""
    function = {"name": name, "description": description, "parameters": parameters}
    assert render([], [{"type": "function", "function": function}]) == render(
        [], [{"type": "function", **function}]
    )


class TestShape:
    @given(conversations, st.lists(messages(), max_size=3), tools)
    def test_an_extended_conversation_has_no_break(
        self, conversation: list[Any], more: list[Any], tool_list: Any
    ) -> None:
        assert (
            where_it_breaks(shape_of(conversation, tool_list), shape_of([*conversation, *more], tool_list))
            is None
        )

    @given(st.lists(messages(role="user"), min_size=1, max_size=5), st.data())
    def test_an_edit_is_found_at_its_message_and_piece(
        self, conversation: list[Any], data: st.DataObject
    ) -> None:
        index = data.draw(st.integers(0, len(conversation) - 1))
        old = conversation[index]["content"]
        at = data.draw(st.integers(0, len(old)))
        new = old[:at] + data.draw(st.text(min_size=1, max_size=5)) + old[at:]
        edited = [*conversation[:index], {"role": "user", "content": new}, *conversation[index + 1 :]]
        # an edit that turns a message into its successor reads as that message dropped
        assume(index + 1 >= len(conversation) or conversation[index + 1]["content"] != new)
        found = where_it_breaks(shape_of(conversation), shape_of(edited))
        assert found is not None
        assert (found.kind, found.message, found.role) == ("edited", index, "user")
        first = next((i for i, (a, b) in enumerate(zip(old, new, strict=False)) if a != b), len(old))
        assert found.offset == first // PIECE_CHARS * PIECE_CHARS  # the piece of the first changed character


@given(st.binary(max_size=5000), st.lists(st.integers(0, 5200), max_size=6))
def test_a_prefix_digest_is_the_digest_of_that_prefix_asked_once_or_again(
    stream: bytes, lengths: list[int]
) -> None:
    """``extends`` compares a previous prompt's digest with this prompt's prefix digest, remembered
    per length: asked twice, or at the whole length, it is still the digest of exactly those bytes."""
    chain = chain_of(stream)
    for length in [*lengths, *lengths, len(stream)]:
        expected = chain_of(stream[:length]).whole if length <= len(stream) else None
        assert chain.prefix_digest(length) == expected


@given(st.binary(max_size=6000), st.binary(max_size=6000), st.integers(0, 6000))
def test_two_chains_share_exactly_their_common_whole_chunks(a: bytes, b: bytes, cut: int) -> None:
    """``common`` (a binary search on positions) agrees with counting equal leading chunks of bytes."""
    b = a[:cut] + b  # share a prefix of any length
    chunk = CHUNK_BYTES
    same = 0
    while (same + 1) * chunk <= min(len(a), len(b)) and a[same * chunk : (same + 1) * chunk] == b[
        same * chunk : (same + 1) * chunk
    ]:
        same += 1
    assert chain_of(a).common(chain_of(b).hashes) == same
    assert chain_of(a).matched(frozenset(chain_of(b).hashes)) == same
