"""Session keys: the documented priority, and prefix hashes that ignore JSON layout."""

from __future__ import annotations

import pytest

from policies.sessions import explicit_session
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
        ({"session-id": "x"}, {"prompt_cache_key": "k"}, ("a:x", SessionSource.AGENT_HEADER)),  # Codex 0.171
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
