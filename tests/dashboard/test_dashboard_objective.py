"""The decision page says which token a request's client waits for (issue #61), on a stack of its own:
its agent session takes a llama.cpp slot, which the other dashboard tests' sessions must not meet."""

from __future__ import annotations

from typing import Any

from tests.dashboard.conftest import screenshot
from tests.dashboard.test_dashboard import ask, log_in
from tests.e2e.conftest import Stack


def test_a_decision_says_which_token_its_client_waits_for(page: Any, stack: Stack) -> None:
    """An agent's request is compared by the time to the last token and the page says why; a chat
    request by the first (issue #61)."""
    log_in(page, stack)
    agent = ask(stack, **{"x-session-id": "agent-1", "x-turnout-wait-for": "last-token"})
    page.goto(f"{stack.url}/admin/decisions/{agent}")
    text = page.inner_text("p.objective")
    assert "time to the last token: the client waits for the whole answer" in text
    assert "x-turnout-wait-for" in text
    assert "predicted last token" in page.inner_text("table")
    screenshot(page, "decision-agent")
    chat = ask(stack, **{"x-session-id": "chat-1"})
    page.goto(f"{stack.url}/admin/decisions/{chat}")
    assert "time to the first token: a reader waits for the first token" in page.inner_text("p.objective")
    assert page.errors == []
