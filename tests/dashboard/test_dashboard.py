"""The dashboard, as an operator uses it: log in, watch decisions arrive, steer the router."""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

import httpx
import openai

from policies.sessions import session_label
from policies.shape import PIECE_CHARS
from tests.dashboard.conftest import HOSTILE, ask, log_in, screenshot
from tests.e2e.conftest import Stack
from tests.servers import ADMIN, ADMIN_TOKEN


def test_login_refuses_a_wrong_token_then_shows_both_backends(page: Any, stack: Stack) -> None:
    page.goto(stack.url + "/admin/login")
    screenshot(page, "login")
    page.fill("input[name=token]", "wrong")
    page.click("button")
    assert "That is not the admin token." in page.content()
    log_in(page, stack)
    page.wait_for_selector('section.backend[data-backend="llama"] .health.ready')
    ids = page.eval_on_selector_all("section.backend", "nodes => nodes.map(n => n.dataset.backend)")
    assert ids == ["vllm", "llama"]
    assert page.locator('section.backend[data-backend="llama"] table.slots tbody tr').count() == 2
    screenshot(page, "overview")
    assert page.errors == []


def test_a_request_appears_on_the_live_decisions_page(page: Any, stack: Stack) -> None:
    log_in(page, stack)
    page.goto(stack.url + "/admin/decisions")
    request_id = ask(stack, **{"x-session-id": "live-1"})
    row = page.wait_for_selector(f'tr[data-id="{request_id}"]', timeout=30_000)  # no reload: the live refresh
    assert "m-both" in row.inner_text()
    assert "live-1" in row.inner_text()  # the session by the name the client gave it
    assert "vllm" in row.inner_text()
    assert "llama" in row.inner_text()
    screenshot(page, "decisions")
    row.query_selector("a").click()
    page.wait_for_url(f"**/admin/decisions/{request_id}")
    assert "Candidates" in page.content()
    assert "costs the next requests" in page.inner_text("table")  # what it would cost those after it
    screenshot(page, "decision")
    page.goto(stack.url + "/admin")
    chart = page.wait_for_selector(".chart polyline.actual", state="attached")
    assert chart.get_attribute("points")  # predicted vs actual TTFT, drawn
    assert page.locator(".chart circle.actual").count() >= 1
    screenshot(page, "overview")
    assert page.errors == []


def test_a_first_turn_known_by_content_says_how_often_its_kind_came_back(page: Any, stack: Stack) -> None:
    log_in(page, stack)
    request_id = ask(stack, content="Summarise this changelog.")  # no session id, a prompt never seen
    decision = httpx.get(stack.url + "/admin/api/decisions/" + request_id, headers=ADMIN).json()
    assert decision["session_source"] == "implicit"
    rate = decision["follow_up_rate"]
    assert 0.0 < rate < 1.0
    page.goto(f"{stack.url}/admin/decisions/{request_id}")
    text = page.inner_text("p.follow-up")
    assert f"came back for a second turn {rate * 100:.0f}% of the time lately" in text
    looks_ahead = any(c.get("look_ahead_turns", 0) > 0 for c in decision["candidates"])
    assert ("its next turns are weighed by that chance" in text) == looks_ahead
    screenshot(page, "decision-first-turn")
    named = ask(stack, **{"x-session-id": "named-1"})
    assert (
        httpx.get(stack.url + "/admin/api/decisions/" + named, headers=ADMIN).json()["follow_up_rate"] is None
    )
    page.goto(f"{stack.url}/admin/decisions/{named}")
    assert page.locator("p.follow-up").count() == 0
    assert page.errors == []


def test_switch_profile_and_drain_and_the_next_decision_follows(page: Any, stack: Stack) -> None:
    log_in(page, stack)
    page.goto(stack.url + "/admin/policy")
    page.select_option("#profile-select", "prefer-llamacpp")
    page.click("#switch-profile")
    page.wait_for_selector("#active-profile:text('prefer-llamacpp')")
    decision = httpx.get(stack.url + "/admin/api/decisions/" + ask(stack), headers=ADMIN).json()
    assert (decision["profile"], decision["chosen"]) == ("prefer-llamacpp", "llama")

    page.click('button.drain[data-backend="llama"]')
    page.wait_for_selector('tr[data-backend="llama"] td.state:text("drained")')
    decision = httpx.get(stack.url + "/admin/api/decisions/" + ask(stack), headers=ADMIN).json()
    assert decision["chosen"] == "vllm"
    assert {"backend": "llama", "reason": "drained"}.items() <= decision["rejected"][0].items()
    audit = page.inner_text("#audit")
    assert "switch-profile" in audit
    assert "drain" in audit
    assert "browser" in audit
    screenshot(page, "policy")

    page.click('button.drain[data-backend="llama"]')  # undrain, and the default profile back
    page.wait_for_selector('tr[data-backend="llama"] td.state:text("taking requests")')
    page.select_option("#profile-select", "cost")
    page.click("#switch-profile")
    page.wait_for_selector("#active-profile:text('cost')")
    assert page.errors == []


def test_actions_need_the_csrf_token_and_the_api_a_login(stack: Stack) -> None:
    assert httpx.get(stack.url + "/admin/api/decisions").status_code == 401
    assert (
        httpx.get(stack.url + "/admin/decisions", follow_redirects=False).headers["location"]
        == "/admin/login"
    )
    with httpx.Client(base_url=stack.url, follow_redirects=False) as browserish:
        login = browserish.post("/admin/login", data={"token": ADMIN_TOKEN})
        cookie = login.headers["set-cookie"].lower()
        assert "httponly" in cookie
        assert "samesite=strict" in cookie
        refused = browserish.post("/admin/api/backends/llama/drain")  # the cookie, but no CSRF token
        assert refused.status_code == 403
    drained = httpx.post(stack.url + "/admin/api/backends/nope/drain", headers=ADMIN)
    assert drained.status_code == 404
    assert "unknown backend 'nope'" in drained.json()["error"]["message"]


def test_markup_a_client_sent_is_shown_as_text(page: Any, stack: Stack) -> None:
    """A model name, a session id and a request id with markup in them: nothing executes."""
    ask(stack, HOSTILE, **{"x-session-id": "<script>window.xss=2</script>", "x-request-id": "<b>x</b>"})
    log_in(page, stack)
    for path in (
        "/admin",
        "/admin/decisions",
        f"/admin/decisions?model={HOSTILE}",
        "/admin/policy",
        "/admin/sessions",
    ):
        page.goto(stack.url + path)
        page.wait_for_timeout(300)  # a live refresh too
        assert page.evaluate("window.xss") is None, path
    page.goto(stack.url + "/admin/decisions")
    page.wait_for_selector("#decisions tbody tr")
    assert HOSTILE in page.inner_text("#decisions")  # shown, as text
    assert "<script>window.xss=2</script>" in page.inner_text("#decisions")  # the session's name, as text
    assert page.errors == []


def test_a_session_timeline_shows_where_an_edited_message_broke_the_prefix(page: Any, stack: Stack) -> None:
    """Four turns; the third edits the first user message: the timeline reports the break there."""
    client = openai.OpenAI(base_url=stack.url + "/v1", api_key="k", max_retries=0)
    system = {"role": "system", "content": "You are a careful coding agent. " * 200}
    first = "Here is the file:\n" + "def f(x):\n    return x + 1\n" * 300
    history: list[dict[str, str]] = [system, {"role": "user", "content": first}]
    edit_at = 4000
    for turn in range(4):
        if turn == 2:  # the agent rewrote the file it pasted in turn one
            history[1] = {"role": "user", "content": first[:edit_at] + "# EDITED\n" + first[edit_at:]}
        answer = client.chat.completions.create(
            model="m-both",
            messages=history,
            max_tokens=8,
            extra_headers={"x-session-id": "edit-me"},  # type: ignore[arg-type]
        )
        history += [
            {"role": "assistant", "content": answer.choices[0].message.content or ""},
            {"role": "user", "content": f"Now step {turn + 2}: " + "explain the change. " * 40},
        ]
    label = session_label("h:edit-me")
    log_in(page, stack)
    page.goto(stack.url + "/admin/sessions")
    assert page.inner_text(f'tr[data-session="{label}"] a') == "edit-me"  # by its own name
    screenshot(page, "sessions")
    page.click(f'tr[data-session="{label}"] a')
    page.wait_for_url(f"**/admin/sessions/{label}")
    assert page.inner_text("h1").startswith("Session edit-me")
    rows = page.locator("#timeline tbody tr")
    assert rows.count() == 4
    third = page.inner_text('#timeline tr[data-turn="3"] td.prefix')
    expected_offset = edit_at // PIECE_CHARS * PIECE_CHARS
    assert f"message 1 (user) was edited at character ~{expected_offset}" in third
    assert "re-prefilled" in third
    cached = [
        t["cached_tokens"]
        for t in httpx.get(stack.url + "/admin/api/sessions/edit-me", headers=ADMIN).json()["timeline"]
    ]
    assert page.inner_text('#timeline tr[data-turn="1"] td.prefix') == "nothing cached"  # a first turn
    second = f"reused {cached[1]} tokens" if cached[1] else "nothing cached"
    turn_2 = page.inner_text('#timeline tr[data-turn="2"] td.prefix')
    # the second extends the first: it reused what it found, or the router moved it (the gateway's
    # load from the other tests decides), and it is never taken for an edit
    assert turn_2 == second or turn_2.startswith("broke: moved from"), turn_2
    assert "message" not in turn_2
    # the fourth extends the third: whatever the slots did meanwhile (other tests share this gateway),
    # its prompt did not break
    assert "message" not in page.inner_text('#timeline tr[data-turn="4"] td.prefix')
    screenshot(page, "session")
    ask(stack)  # a streamed request: its TTFT is charted (the agent's turns above are not streamed)
    page.goto(stack.url + "/admin")  # the overview again, with every test's traffic in its charts
    page.wait_for_selector(".chart circle.actual", state="attached")
    screenshot(page, "overview")
    ask(stack, "m-llama", **{"x-session-id": "release-me"})  # a named session's turn leases its slot
    page.goto(stack.url + "/admin/sessions/release-me")
    assert "holds llama slot" in page.inner_text("main")
    page.click("#release")  # a POST, then the page reloads: wait for the audit entry, not the reload
    deadline = time.monotonic() + 30
    while "release-slot" not in httpx.get(stack.url + "/admin/api/policy", headers=ADMIN, timeout=30).text:
        assert time.monotonic() < deadline, "the release never reached the policy's audit log"
        time.sleep(0.1)
    audit = httpx.get(stack.url + "/admin/api/policy", headers=ADMIN, timeout=30).json()["audit"]
    assert any(e["detail"].startswith("session release-me: llama slot") for e in audit)  # by its name
    assert page.errors == []


def test_the_admin_api_is_in_the_openapi_schema(stack: Stack) -> None:
    schema = httpx.get(stack.url + "/schema/openapi.json").json()
    paths = set(schema["paths"])
    assert {"/admin/api/overview", "/admin/api/decisions", "/admin/api/sessions/{label}", "/admin/api/policy",
            "/admin/api/policy/profile", "/admin/api/series", "/v1/chat/completions"} <= paths  # fmt: skip
    assert not {p for p in paths if p.startswith("/admin/") and not p.startswith("/admin/api/")}  # no pages
    assert "cache-hit ratio" in schema["paths"]["/admin/api/overview"]["get"]["description"]


def test_pin_a_group_and_its_conversations_move_with_the_move_shown(page: Any, stack: Stack) -> None:
    """Last in the module: a pinned group's traffic on the shared gateway moves its slots and learning."""
    log_in(page, stack)
    first = httpx.get(
        stack.url + "/admin/api/decisions/" + ask(stack, "grp", **{"x-session-id": "pin-me"}), headers=ADMIN
    ).json()
    other = {"m-vllm": "m-llama", "m-llama": "m-vllm"}[first["chosen_model"]]
    page.goto(stack.url + "/admin/policy")
    page.select_option('select.pin-member[data-group="grp"]', other)
    page.click('button.pin[data-group="grp"]')
    page.wait_for_selector(f'tr[data-group="grp"] td.state:text("pinned to {other}")')
    screenshot(page, "policy-pinned")
    request_id = ask(stack, "grp", **{"x-session-id": "pin-me"})
    decision = httpx.get(stack.url + "/admin/api/decisions/" + request_id, headers=ADMIN).json()
    assert decision["chosen_model"] == other
    assert (decision["moved"]["from_model"], decision["moved"]["to_model"]) == (first["chosen_model"], other)
    assert "group-pinned" in {r["reason"] for r in decision["rejected"]}
    page.goto(f"{stack.url}/admin/decisions/{request_id}")
    assert f"(model {first['chosen_model']} → {other})" in page.inner_text("main")
    assert "group-pinned" in page.inner_text("main")
    screenshot(page, "decision-moved")
    page.goto(stack.url + "/admin/policy")
    page.click('button.unpin[data-group="grp"]')
    page.wait_for_selector('tr[data-group="grp"] td.state:text("member chosen per request")')
    assert "pin" in page.inner_text("#audit")
    assert page.errors == []


def test_recording_is_switched_on_and_off_from_the_policy_page(page: Any, stack: Stack) -> None:
    log_in(page, stack)
    page.goto(stack.url + "/admin/policy")
    assert page.inner_text("#record-state").startswith("not recording")
    page.click("#record")
    page.wait_for_selector('#record-state:text("recording to")')
    screenshot(page, "policy")
    ask(stack, stream=False)
    path = Path(str(stack.settings.record.path))
    assert len(path.read_text().splitlines()) == 1
    page.click("#record")
    page.wait_for_selector('#record-state:text("not recording")')
    ask(stack, stream=False)
    assert len(path.read_text().splitlines()) == 1
    assert "stop-recording" in page.inner_text("#audit")
    assert page.errors == []
