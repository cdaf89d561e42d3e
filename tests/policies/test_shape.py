"""Where a prompt stopped extending the previous one: per-message digests, no text kept."""

from __future__ import annotations

from msgspec.structs import replace

from policies.shape import PIECE_CHARS, shape_of, where_it_breaks

SYSTEM = {"role": "system", "content": "You are a coding agent. " * 40}
TOOLS = [{"type": "function", "function": {"name": "read", "parameters": {}}}]


def turn(*messages: dict[str, object]) -> list[dict[str, object]]:
    return [SYSTEM, *messages]


def test_a_prompt_that_extends_the_last_one_has_no_break() -> None:
    first = turn({"role": "user", "content": "fix the bug"})
    second = [*first, {"role": "assistant", "content": "done"}, {"role": "user", "content": "thanks"}]
    assert where_it_breaks(shape_of(first, TOOLS), shape_of(second, TOOLS)) is None


def test_an_edited_message_is_found_with_its_offset() -> None:
    long = "x" * (3 * PIECE_CHARS) + "the end"
    first = turn({"role": "user", "content": long}, {"role": "assistant", "content": "ok"})
    edited = turn(
        {"role": "user", "content": long[: 2 * PIECE_CHARS + 10] + "CHANGED"},
        {"role": "assistant", "content": "ok"},
    )
    found = where_it_breaks(shape_of(first), shape_of(edited))
    assert found is not None
    assert (found.kind, found.message, found.role, found.offset) == ("edited", 1, "user", 2 * PIECE_CHARS)


def test_dropped_messages_tools_and_stripped_reasoning() -> None:
    a, b = {"role": "user", "content": "a"}, {"role": "assistant", "content": "b"}
    c = {"role": "user", "content": "c"}
    dropped = where_it_breaks(shape_of(turn(a, b, c)), shape_of(turn(b, c)))
    assert dropped is not None
    assert (dropped.kind, dropped.message) == ("dropped", 1)
    tools = where_it_breaks(shape_of(turn(a), TOOLS), shape_of(turn(a), []))
    assert tools is not None
    assert tools.kind == "tools-changed"
    thinking = {"role": "assistant", "content": "b", "reasoning_content": "because"}
    stripped = where_it_breaks(shape_of(turn(a, thinking, c)), shape_of(turn(a, b, c)))
    assert stripped is not None
    assert (stripped.kind, stripped.message) == ("reasoning-stripped", 2)


def test_a_changed_role_tool_call_or_call_id_is_an_edit() -> None:
    read = {"function": {"name": "read", "arguments": "a"}}
    call = {"role": "assistant", "content": "", "tool_calls": [read]}
    result = {"role": "tool", "content": "42", "tool_call_id": "call_1"}
    before = shape_of(turn(call, result))
    other_call = {**call, "tool_calls": [{"function": {"name": "read", "arguments": "b"}}]}
    other_id = {**result, "tool_call_id": "call_2"}
    for changed, index in ((turn(other_call, result), 1), (turn(call, other_id), 2)):
        found = where_it_breaks(before, shape_of(changed))
        assert found is not None
        assert (found.kind, found.message) == ("edited", index)
    assert where_it_breaks(before, shape_of(turn(call, {**result, "role": "user"}))) is not None


def test_shapes_digested_differently_are_not_compared() -> None:
    """A session last seen by a turnout that digested with BLAKE2b (``digests`` 1): its digests
    differ from today's for the same text, which is no edit."""
    first = turn({"role": "user", "content": "fix the bug"})
    older = replace(shape_of(first), digests=1)
    edited = shape_of(turn({"role": "user", "content": "something else"}))
    assert where_it_breaks(older, edited) is None
    assert where_it_breaks(shape_of(first), edited) is not None
