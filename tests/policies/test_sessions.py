"""Session keys: the documented priority, and prefix hashes that ignore JSON layout."""

from __future__ import annotations

import pytest

from policies.sessions import explicit_session, prefix_hashes
from policies.types import SessionSource


@pytest.mark.parametrize(
    ("headers", "body", "expected"),
    [
        (
            {"x-session-id": "s1", "x-claude-code-session-id": "c"},
            {"user": "u"},
            ("h:s1", SessionSource.HEADER),
        ),
        ({"x-claude-code-session-id": "c"}, {"user": "u"}, ("a:c", SessionSource.AGENT_HEADER)),
        ({}, {"prompt_cache_key": "k", "user": "u"}, ("k:k", SessionSource.PROMPT_CACHE_KEY)),
        ({}, {"user": "u"}, ("u:u", SessionSource.USER)),
        ({}, {"metadata": {"user_id": "m"}}, ("m:m", SessionSource.METADATA)),
        ({"x-session-id": "  "}, {"user": 3}, (None, SessionSource.NONE)),
    ],
)
def test_priority(
    headers: dict[str, str], body: dict[str, object], expected: tuple[str | None, SessionSource]
) -> None:
    assert explicit_session(headers, body) == expected


def test_growing_conversation_shares_leading_hashes() -> None:
    turn1 = [{"role": "system", "content": "s"}, {"role": "user", "content": "q1"}]
    turn2 = [*turn1, {"role": "assistant", "content": "a1"}, {"role": "user", "content": "q2"}]
    assert prefix_hashes(turn2)[: len(turn1)] == prefix_hashes(turn1)


def test_layout_does_not_matter_but_content_does() -> None:
    plain = [{"role": "user", "content": "hello"}]
    parts = [{"content": [{"type": "text", "text": "hello"}], "role": "user"}]
    assert prefix_hashes(plain) == prefix_hashes(parts)
    assert prefix_hashes(plain) != prefix_hashes([{"role": "user", "content": "hello!"}])
    assert prefix_hashes(plain) != prefix_hashes(plain, tools=[{"function": {"name": "f"}}])
