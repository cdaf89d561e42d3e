"""Sessions by the names clients send (issue #29): in the sessions API and the decision log, as a
filter, as the session page's address; ``admin.redact_session_ids`` keeps hashes only."""

from __future__ import annotations

from typing import Any

import httpx
import pytest

from gateway.app import create_app
from gateway.settings import load_settings
from policies.sessions import session_label
from tests.e2e.conftest import Stack, start_stack, stop_stack
from tests.redis_server import RedisServer
from tests.servers import ADMIN, ADMIN_TOKEN, ServerThread


def ask(stack: Stack, headers: dict[str, str] | None = None, **body: Any) -> str:
    payload = {"model": "m-both", "max_tokens": 2, "messages": [{"role": "user", "content": "hi"}], **body}
    response = httpx.post(stack.url + "/v1/chat/completions", json=payload, headers=headers, timeout=30)
    assert response.status_code == 200, response.text
    return response.headers["x-request-id"]


def admin(stack: Stack, path: str) -> Any:
    response = httpx.get(stack.url + path, headers=ADMIN, timeout=30)
    assert response.status_code == 200, response.text
    return response.json()


@pytest.mark.parametrize(
    ("how", "key", "source"),
    [
        ({"headers": {"x-session-id": "agent-7"}}, "h:agent-7", "header"),
        ({"prompt_cache_key": "codex-thread-9"}, "k:codex-thread-9", "prompt_cache_key"),
        ({"user": "ada@example.com"}, "u:ada@example.com", "user"),
    ],
)
def test_a_session_goes_by_the_name_its_client_gave_it(
    stack: Stack, how: dict[str, Any], key: str, source: str
) -> None:
    request_id = ask(stack, **how)
    name, label = key[2:], session_label(key)
    decision = admin(stack, f"/admin/api/decisions/{request_id}")
    assert (decision["session"], decision["session_name"], decision["session_source"]) == (
        label,
        name,
        source,
    )
    rows = {row["session"]: row for row in admin(stack, "/admin/api/sessions")["data"]}
    assert (rows[label]["name"], rows[label]["source"]) == (name, source)
    by_name = admin(stack, f"/admin/api/decisions?session={name}")["data"]
    assert [d["request_id"] for d in by_name] == [request_id]
    assert admin(stack, f"/admin/api/decisions?session={label}")["data"] == by_name  # the hash still works
    assert admin(stack, f"/admin/api/sessions/{name}")["session"] == label  # its page, by its name
    page = httpx.get(f"{stack.url}/admin/sessions/{label}", headers=ADMIN, timeout=30).text
    assert f"Session {name}" in page


def test_a_session_known_by_its_content_has_no_name(stack: Stack) -> None:
    messages = [{"role": "user", "content": "implicit one"}]
    first = ask(stack, messages=messages)
    second = ask(
        stack,
        messages=[*messages, {"role": "assistant", "content": "ok"}, {"role": "user", "content": "and?"}],
    )
    for request_id in (first, second):
        decision = admin(stack, f"/admin/api/decisions/{request_id}")
        assert decision["session_name"] is None


def test_redacted_sessions_show_only_their_hash() -> None:
    running = start_stack(admin={"token": ADMIN_TOKEN, "redact_session_ids": True})
    try:
        request_id = ask(running, headers={"x-session-id": "ada@example.com"})
        label = session_label("h:ada@example.com")
        decision = admin(running, f"/admin/api/decisions/{request_id}")
        assert (decision["session"], decision["session_name"]) == (label, None)
        assert "ada@example.com" not in str(admin(running, "/admin/api/sessions"))
        assert admin(running, "/admin/api/decisions?session=ada@example.com")["data"] == []
        missing = httpx.get(running.url + "/admin/api/sessions/ada@example.com", headers=ADMIN, timeout=30)
        assert missing.status_code == 404
        assert (
            "ada@example.com"
            not in httpx.get(running.url + "/admin/sessions", headers=ADMIN, timeout=30).text
        )
    finally:
        stop_stack(running)


def test_a_name_two_sessions_share_opens_neither(stack: Stack) -> None:
    """``x-session-id: bob`` and ``user: bob`` are two sessions named ``bob``: the name alone is no
    address (an action on it could reach the wrong one); each hash still is."""
    ask(stack, headers={"x-session-id": "bob"})
    ask(stack, user="bob")
    shared = httpx.get(stack.url + "/admin/api/sessions/bob", headers=ADMIN, timeout=30)
    assert shared.status_code == 404
    for key in ("h:bob", "u:bob"):
        assert admin(stack, f"/admin/api/sessions/{session_label(key)}")["name"] == "bob"


def test_redaction_hides_the_names_logged_before_it(redis_server: RedisServer) -> None:
    """Names in a shared decision log written before ``redact_session_ids`` was turned on are hidden
    by a gateway that has it on, and cannot be filtered on."""
    state = {"url": redis_server.url, "prefix": "redact-later", "timeout_s": 5.0}
    running = start_stack(state=state)
    redacted = None
    try:
        request_id = ask(running, headers={"x-session-id": "ada@example.com"})
        assert admin(running, f"/admin/api/decisions/{request_id}")["session_name"] == "ada@example.com"
        settings = load_settings(
            None,
            backends=[b.model_dump() for b in running.settings.backends],
            models=[m.model_dump() for m in running.settings.models],
            state=state,
            admin={"token": ADMIN_TOKEN, "redact_session_ids": True},
        )
        redacted = ServerThread(create_app(settings)).start()
        entry = httpx.get(
            f"{redacted.url}/admin/api/decisions/{request_id}", headers=ADMIN, timeout=30
        ).json()
        assert (entry["session"], entry["session_name"]) == (session_label("h:ada@example.com"), None)
        listed = httpx.get(redacted.url + "/admin/api/decisions", headers=ADMIN, timeout=30).text
        assert "ada@example.com" not in listed
        by_name = httpx.get(
            redacted.url + "/admin/api/decisions?session=ada@example.com", headers=ADMIN, timeout=30
        ).json()
        assert by_name["data"] == []
    finally:
        if redacted is not None:
            redacted.stop()
        stop_stack(running)


def fill_the_llama_slots(stack: Stack, names: list[str]) -> str:
    """Each named session sends a first turn to the llama.cpp backend (two slots): the third takes
    a slot from one of the first two. Returns its request id."""
    ids = []
    for name in names:
        payload = {
            "model": "m-llama",
            "max_tokens": 2,
            "messages": [{"role": "user", "content": f"hi from {name}"}],
        }
        response = httpx.post(
            stack.url + "/v1/chat/completions", json=payload, headers={"x-session-id": name}, timeout=30
        )
        assert response.status_code == 200, response.text
        ids.append(response.headers["x-request-id"])
    return ids[-1]


def test_an_evicted_session_is_named_the_same_everywhere(stack: Stack) -> None:
    """One identifier for a session: the reason text, the candidate's note and ``evicts_name`` say
    the name its client gave it; ``evicts`` is its one hash, as ``session`` is (issue #41)."""
    request_id = fill_the_llama_slots(stack, ["names-a", "names-b", "names-c"])
    decision = admin(stack, f"/admin/api/decisions/{request_id}")
    chosen = next(c for c in decision["candidates"] if c["backend"] == decision["chosen"])
    victim = chosen["evicts_name"]
    assert victim in ("names-a", "names-b")
    assert chosen["evicts"] == session_label(f"h:{victim}")
    assert f"from session {victim} " in decision["reason"]
    assert f"from session {victim} " in chosen["note"]
    assert session_label(f"h:{victim}") not in decision["reason"]
    page = httpx.get(f"{stack.url}/admin/decisions/{request_id}", headers=ADMIN, timeout=30).text
    assert f"from session {victim} " in page


def test_a_redacted_eviction_names_the_hash_only() -> None:
    running = start_stack(admin={"token": ADMIN_TOKEN, "redact_session_ids": True})
    try:
        request_id = fill_the_llama_slots(running, ["red-a@example.com", "red-b@example.com", "red-c"])
        decision = admin(running, f"/admin/api/decisions/{request_id}")
        chosen = next(c for c in decision["candidates"] if c["backend"] == decision["chosen"])
        assert chosen["evicts_name"] is None
        assert f"from session {chosen['evicts']} " in decision["reason"]
        assert "example.com" not in str(decision)
    finally:
        stop_stack(running)


def test_a_count_tokens_decision_takes_no_slot(stack: Stack) -> None:
    """Counting runs no prompt: its decision names no slot, and its reason takes none from anyone."""
    fill_the_llama_slots(stack, ["count-a", "count-b"])
    body = {"model": "m-llama", "messages": [{"role": "user", "content": "how many tokens?"}]}
    response = httpx.post(stack.url + "/v1/messages/count_tokens", json=body, timeout=30)
    assert response.status_code == 200, response.text
    decision = admin(stack, f"/admin/api/decisions/{response.headers['x-request-id']}")
    assert decision["slot"] is None
    assert "slot" not in decision["reason"]
    assert all(c.get("evicts") is None for c in decision["candidates"])
    # a count has no first token: no predicted TTFT shown for it (it was its prefill price, 9.3 s),
    # and the TTFT chart draws only requests whose first token was measured
    assert all("predicted_ttft_s" not in c and "predicted_total_s" not in c for c in decision["candidates"])
    plain = httpx.post(stack.url + "/v1/chat/completions", json={**body, "max_tokens": 4}, timeout=30)
    assert plain.status_code == 200  # a whole body: no first token measured on vLLM's simulator either
    series = admin(stack, "/admin/api/series?minutes=60")["backends"]
    drawn = [point for line in series.values() for point in line["ttft"]]
    assert all(predicted is not None and actual is not None for _, predicted, actual in drawn)


def test_the_session_page_offers_release_only_for_a_held_slot(stack: Stack) -> None:
    on_vllm = session_label("h:page-vllm")
    ask(stack, headers={"x-session-id": "page-vllm"}, model="m-vllm")
    page = httpx.get(f"{stack.url}/admin/sessions/{on_vllm}", headers=ADMIN, timeout=30).text
    assert "holds no slot" in page
    assert 'id="release"' not in page
    fill_the_llama_slots(stack, ["page-llama"])
    held = admin(stack, f"/admin/api/sessions/{session_label('h:page-llama')}")
    assert held["holds"] == [{"backend": "llama", "slot": held["slot"]}]
    page = httpx.get(f"{stack.url}/admin/sessions/page-llama", headers=ADMIN, timeout=30).text
    assert 'id="release"' in page


def test_a_turn_that_reused_nothing_is_not_called_reused(stack: Stack) -> None:
    """A first turn has nothing cached: the timeline says so; a second turn on its warm slot says
    how much it reused."""
    first = [{"role": "user", "content": "a timeline of its own"}]
    payload = {"model": "m-llama", "max_tokens": 2, "messages": first}
    headers = {"x-session-id": "timeline-words"}
    answer = httpx.post(stack.url + "/v1/chat/completions", json=payload, headers=headers, timeout=30).json()
    text = answer["choices"][0]["message"]["content"] or "ok"
    payload["messages"] = [
        *first,
        {"role": "assistant", "content": text},
        {"role": "user", "content": "more"},
    ]
    httpx.post(stack.url + "/v1/chat/completions", json=payload, headers=headers, timeout=30)
    session = admin(stack, "/admin/api/sessions/timeline-words")
    cached = [turn["cached_tokens"] for turn in session["timeline"]]
    assert cached[0] == 0
    assert cached[1] > 0
    page = httpx.get(f"{stack.url}/admin/sessions/timeline-words", headers=ADMIN, timeout=30).text
    assert page.count("nothing cached") == 1
    assert f"reused {cached[1]} tokens" in page


def test_sessions_filter_by_name_and_turns(stack: Stack) -> None:
    """Two turns of a named agent among one-off requests: the page's default (two turns or more)
    shows it and says how many others it left out; ``q`` finds a session by its name."""
    first = [{"role": "user", "content": "filter me"}]
    headers = {"x-session-id": "filter-agent"}
    payload = {"model": "m-llama", "max_tokens": 2, "messages": first}
    httpx.post(stack.url + "/v1/chat/completions", json=payload, headers=headers, timeout=30)
    payload["messages"] = [
        *first,
        {"role": "assistant", "content": "ok"},
        {"role": "user", "content": "again"},
    ]
    httpx.post(stack.url + "/v1/chat/completions", json=payload, headers=headers, timeout=30)
    ask(stack, headers={"x-session-id": "filter-one-off"})
    found = admin(stack, "/admin/api/sessions?q=filter-&min_turns=2")
    assert [row["name"] for row in found["data"]] == ["filter-agent"]
    assert found["hidden"] == found["live"] - 1
    assert [row["name"] for row in admin(stack, "/admin/api/sessions?q=FILTER-ONE")["data"]] == [
        "filter-one-off"
    ]
    page = httpx.get(stack.url + "/admin/sessions", headers=ADMIN, timeout=30).text
    assert "filter-agent" in page
    assert "filter-one-off" not in page
    assert "left out by the filter" in page
