"""What the client waits for: the first token, or the last.

A person reads an answer as it streams: the first token is what they wait for. An agent acts on a
tool call only when the whole call has arrived, so it waits for the last token: GitHub's published
Copilot coding-agent traces average about 530 completion tokens per call (issue #61), 11 s of decode at
48 tokens a second against a warm first token in 0.3-0.4 s. ``policies.cost`` routes a request that
waits for the last token by its predicted time to the last token (``Estimate.objective_total_s``), and
the others by the first (``objective_ttft_s``).

A request waits for the last token when:

- its client says so: ``x-turnout-wait-for: last-token`` (or ``first-token``, which wins over the
  rules below: a client that streams a tool call's arguments to a person);
- it offers **tools** (OpenAI chat and Responses, Anthropic Messages: a non-empty ``tools`` list);
- its session came from an **agent's own session header** (``x-claude-code-session-id``...:
  ``SessionSource.AGENT_HEADER``);
- it belongs to a **session of an agent**: an earlier turn offered tools (``SessionView.agent``).

Anything else (chat without tools, text completions) keeps the first token. The decision log says
which was used and why (``awaited_why``).

``client_of``: the client program, the first product of its ``User-Agent`` (``claude-cli``,
``codex_cli_rs``, ``opencode``, ``openai``...), which the expected answer length is learned per
(``policies.learning``).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from msgspec.structs import replace

from policies.types import Awaited, RequestFeatures, SessionSource, SessionView

WAIT_HEADER = "x-turnout-wait-for"
TOOLS = "tools in the request"
SAID = f"the client's {WAIT_HEADER} header"
AGENT_HEADER = "an agent's session header"
AGENT_SESSION = "a session whose earlier turns offered tools"
MAX_CLIENT_CHARS = 40


def awaited_of(
    body: Mapping[str, Any], source: SessionSource, headers: Mapping[str, str] | None = None
) -> tuple[Awaited, str]:
    """What a request's client waits for, and why, from its headers (lower-case names), its body and
    how its session was recognised."""
    said = (headers or {}).get(WAIT_HEADER, "").strip().lower()
    if said in (Awaited.LAST_TOKEN.value, Awaited.FIRST_TOKEN.value):
        return Awaited(said), SAID
    tools = body.get("tools")
    if isinstance(tools, list) and tools:
        return Awaited.LAST_TOKEN, TOOLS
    if source is SessionSource.AGENT_HEADER:
        return Awaited.LAST_TOKEN, AGENT_HEADER
    return Awaited.FIRST_TOKEN, ""


def in_session(features: RequestFeatures, session: SessionView | None) -> RequestFeatures:
    """``features`` of a turn of ``session``: an agent's session waits for the last token."""
    if features.awaited_why or session is None or not session.agent:  # a reason already (or none to add)
        return features
    return replace(features, awaited=Awaited.LAST_TOKEN, awaited_why=AGENT_SESSION)


def client_of(headers: Mapping[str, str]) -> str:
    """The client program: the first product of the ``User-Agent`` header, lower case ("" without one)."""
    agent = headers.get("user-agent", "").strip()
    if not agent:
        return ""
    product = agent.split()[0].split("/")[0].lower()
    return product[:MAX_CLIENT_CHARS]
