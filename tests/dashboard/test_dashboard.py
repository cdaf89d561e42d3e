"""The dashboard, as an operator uses it: log in, watch decisions arrive, steer the router."""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

import httpx
import openai

from gateway.admin.accuracy import MAX_DRAWN
from policies import EngineKind
from policies.decision import Outcome
from policies.sessions import session_label
from policies.shape import PIECE_CHARS
from policies.types import Usage
from tests.dashboard.conftest import HOSTILE, screenshot
from tests.e2e.conftest import Stack, start_stack, stop_stack
from tests.servers import ADMIN, ADMIN_TOKEN


def log_in(page: Any, stack: Stack) -> None:
    page.goto(stack.url + "/admin")
    assert page.url.endswith("/admin/login")
    page.fill("input[name=token]", ADMIN_TOKEN)
    page.click("button")
    page.wait_for_url(stack.url + "/admin")


def ask(
    stack: Stack, model: str = "m-both", stream: bool = True, content: str = "hello", **headers: str
) -> str:
    """One request, its id; streamed by default: its first token is observed, so the charts draw its
    TTFT (a non-streamed one is settled, recorded and logged before its answer is sent)."""
    client = openai.OpenAI(base_url=stack.url + "/v1", api_key="k", max_retries=0)
    response = client.chat.completions.with_raw_response.create(
        model=model, messages=[{"role": "user", "content": content}], max_tokens=4, stream=stream,
        extra_headers=headers,
    )  # fmt: skip
    if stream:
        list(response.parse())
    return response.headers["x-request-id"]


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


def test_the_predictions_page_shows_how_far_each_backend_was_off(page: Any, stack: Stack) -> None:
    """Streamed requests: a non-streamed one has a first token only where the engine reports its
    timings, and these simulators run 500 times faster than the times they report
    (tests/dashboard/test_demo_truth.py checks the figures themselves, on real-time engines)."""
    client = openai.OpenAI(base_url=stack.url + "/v1", api_key="k", max_retries=0)
    for index in range(6):
        list(
            client.chat.completions.create(
                model="m-both",
                messages=[{"role": "user", "content": "hello"}],
                max_tokens=4,
                stream=True,
                extra_headers={"x-session-id": f"predicted-{index % 2}"},
            )
        )
    data = httpx.get(stack.url + "/admin/api/predictions?minutes=60", headers=ADMIN, timeout=30).json()
    log_in(page, stack)
    page.goto(stack.url + "/admin/predictions")
    for backend in data["backends"]:
        section = f'section.backend[data-backend="{backend["id"]}"]'
        if backend["requests"]:
            assert page.locator(f"{section} svg.scatter circle.point").count() == backend["drawn"]
            assert backend["drawn"] == min(backend["requests"], MAX_DRAWN)
            assert f"median {backend['median']}" in page.inner_text(f"{section} .ratio")
        assert page.locator(f"{section} table.learned tbody tr").count() == len(backend["learned"])
    assert sum(b["requests"] for b in data["backends"]) >= 6
    screenshot(page, "predictions")
    assert page.errors == []


def _chat(stack: Stack, messages: list[dict[str, str]], session: str) -> Any:
    client = openai.OpenAI(base_url=stack.url + "/v1", api_key="k", max_retries=0)
    return client.chat.completions.with_raw_response.create(
        model="m-llama",
        messages=messages,
        max_tokens=8,
        extra_headers={"x-session-id": session},  # type: ignore[arg-type]
    )


def test_the_slots_page_shows_who_held_each_slot_and_who_was_evicted(page: Any, stack: Stack) -> None:
    """Three conversations on llama.cpp's two slots: the third takes a slot from the least recent, which
    comes back and takes one again. Each answered request is on its slot's lane (the simulators answer
    in milliseconds: at 15 minutes they share a bar), the evictions are marked, a bar opens its newest
    decision and a lane's label its session."""
    firsts = {
        name: {"role": "system", "content": " ".join(f"{name}{n % 97} word{n}" for n in range(700))}
        for name in ("slot-a", "slot-b", "slot-c")
    }
    answers = {}
    for name, first in firsts.items():
        messages = [first, {"role": "user", "content": "go"}]
        answers[name] = _chat(stack, messages, name).parse().choices[0].message.content or ""
    back = [
        firsts["slot-a"],
        {"role": "user", "content": "go"},
        {"role": "assistant", "content": answers["slot-a"]},
        {"role": "user", "content": "and then?"},
    ]
    last = _chat(stack, back, "slot-a").headers["x-request-id"]
    data = httpx.get(stack.url + "/admin/api/slots?minutes=15", headers=ADMIN, timeout=30).json()
    assert httpx.get(stack.url + "/admin/api/slots?minutes=5", headers=ADMIN, timeout=30).status_code == 400
    llama = next(b for b in data["backends"] if b["id"] == "llama")
    vllm = next(b for b in data["backends"] if b["id"] == "vllm")
    lanes = llama["lanes"]
    assert [lane["slot"] for lane in lanes][:2] == ["0", "1"]
    assert sum(lane["requests"] for lane in lanes) >= 4
    assert sum(lane["evictions"] for lane in lanes) >= 2  # slot-c's, then slot-a's on its return
    assert vllm["load"]["samples"] >= 1  # the probes' history
    log_in(page, stack)
    page.goto(stack.url + "/admin/slots?minutes=15")
    section = 'section.backend[data-backend="llama"]'
    for lane in lanes:  # the counts, not the bars: a later render maps time to other pixels (and merges)
        drawn = page.locator(f'{section} g.lane[data-slot="{lane["slot"]}"]')
        assert drawn.get_attribute("data-requests") == str(lane["requests"])
        assert drawn.get_attribute("data-evictions") == str(lane["evictions"])
        assert drawn.locator("a.bar").count() >= (1 if lane["requests"] else 0)
    assert page.locator(f"{section} path.evict").count() >= 1
    assert page.locator('section.backend[data-backend="vllm"] polyline.running').count() == 1
    screenshot(page, "slots")
    holder = next(lane for lane in lanes if lane["holder_name"] == "slot-a")
    page.click(f'{section} g.lane[data-slot="{holder["slot"]}"] text.label a')
    page.wait_for_url(f"**/admin/sessions/{holder['holder']}")
    page.go_back()
    bar = page.locator(f'{section} a.bar[data-request="{last}"]')  # the newest request of its bar
    assert bar.get_attribute("href") == f"/admin/decisions/{last}"
    bar.dispatch_event("click")  # bars may overlap in the last pixel: a click at a point hits the top one
    page.wait_for_url(f"**/admin/decisions/{last}")
    assert page.errors == []


def test_the_what_if_page_replays_the_recording_on_an_edited_fleet(page: Any, stack: Stack) -> None:
    """Recorded traffic, replayed from the page with a second llama-server: a row per profile, the
    oracle and the lower bound, and the command that prints the same numbers by hand."""
    started = httpx.post(stack.url + "/admin/api/record/start", headers=ADMIN, timeout=30)
    assert started.status_code == 200
    for index in range(4):
        ask(stack, **{"x-session-id": f"whatif-{index % 2}"})
    ask(stack, model="m-llama")  # another model's request: counted, not replayed as m-both's
    httpx.post(stack.url + "/admin/api/record/stop", headers=ADMIN, timeout=30)
    log_in(page, stack)
    page.goto(stack.url + "/admin/whatif")
    assert page.locator("table.fleet tbody tr").count() == len(stack.settings.backends)
    page.check('table.fleet tr[data-backend="llama"] input.copy')
    page.click("#run")
    page.wait_for_selector("#whatif-result:not([hidden])", timeout=120_000)
    profiles = [row.get_attribute("data-profile") for row in page.locator("#whatif-table tbody tr").all()]
    assert {"cost", "oracle", "lower-bound"} <= set(profiles)
    assert page.inner_text("#whatif-command").startswith("turnout replay ")
    assert "llama-copy" in page.inner_text("#whatif-table")
    assert page.inner_text("#message") == ""
    summary = page.inner_text("#whatif-summary")
    assert "the 4 requests to m-both" in summary, summary
    assert "not replayed, to other models: m-llama 1" in summary, summary
    assert "not a bound" in page.inner_text("#whatif-result")  # what the oracle is, and is not
    screenshot(page, "whatif")
    assert page.errors == []


def test_the_overview_says_what_routing_bought(page: Any, stack: Stack) -> None:
    for index in range(4):
        ask(stack, **{"x-session-id": f"bought-{index}"})
    data = httpx.get(stack.url + "/admin/api/bought", headers=ADMIN, timeout=30).json()
    assert data["requests"] >= 4
    log_in(page, stack)
    saved = page.locator("#bought .headline .saved")
    assert saved.count() == len(data["total"]) >= 2
    for backend, line in data["total"].items():
        text = page.inner_text(f'#bought .saved[data-backend="{backend}"]')
        verb = "saved" if line["saved_s"] >= 0 else "lost"
        assert f"to {backend}, routing {verb} {abs(line['saved_s']):.1f} s" in text
    assert "understated" in page.inner_text("#bought .hint")
    page.click("#bought summary")
    assert page.locator("#bought table.bought tbody tr").count() == len(data["hours"])
    screenshot(page, "overview-bought")
    assert page.errors == []


def test_a_decision_that_warms_a_slot_says_so(page: Any) -> None:
    """A session's first turn answered on vLLM while its prompt warms a llama.cpp slot: the decision
    page names the slot, when it is ready and what it costs (``policies.warm``). Its own stack: the
    shared one has learned vLLM's speed from wall-clock streams 500x faster than the simulators
    report llama.cpp's (tests/agents/conftest.py, ``assert_one_slot``)."""
    running = start_stack()
    try:
        log_in(page, running)
        system = " ".join(f"rule{i % 50} keeps the agent on task" for i in range(700))
        body = {
            "model": "m-both",
            "messages": [{"role": "system", "content": system}, {"role": "user", "content": "start"}],
            "max_tokens": 200,
        }
        with running.client() as client:
            response = client.post("/v1/chat/completions", json=body, headers={"x-session-id": "warm-1"})
        assert response.headers["x-turnout-backend"] == "vllm"
        page.goto(running.url + f"/admin/decisions/{response.headers['x-request-id']}")
        text = page.inner_text("p.warm-up")
        assert "warms llama slot" in text
        assert "for the session's next turn" in text
        assert "(warming llama slot" in page.inner_text("table")
        screenshot(page, "decision-warm-up")
        assert page.errors == []
    finally:
        stop_stack(running)


def test_a_rate_sample_set_aside_is_shown_with_why(page: Any) -> None:
    """Issue #59's outlier (a 75,890-token prompt timed at 0.052 s) fed to the router: not learned,
    and the overview and the Predictions page say so, how far off and from what. Its own stack: the
    shared one's simulators run 500x faster than they report, which sets samples aside of its own."""
    running = start_stack()
    try:
        core = running.app.state.core
        router = core.router
        deployment = next(d for d in core.catalog.deployments_on("vllm") if d.model == "m-vllm")
        learned = router.learned.for_deployment(deployment, EngineKind.VLLM).prefill_tok_s.value
        usage = Usage(75_890, 40, 0)
        router.absorb(
            Outcome("vllm", deployment.model, EngineKind.VLLM, usage, 0.052, 12.4, 0, 0, True), deployment
        )
        assert router.learned.for_deployment(deployment, EngineKind.VLLM).prefill_tok_s.value == learned
        log_in(page, running)
        for path in ("/admin", "/admin/predictions"):
            page.goto(running.url + path)
            row = page.locator(
                'section.backend[data-backend="vllm"] table.learned tbody tr', has_text=deployment.model
            )
            text = row.first.inner_text()
            assert "prefill 1: last 1,459,423 tok/s, 221x the learned 6,600" in text, text
            assert "x the learned" in text
            assert "set aside" in page.inner_text('section.backend[data-backend="vllm"] table.learned thead')
        screenshot(page, "predictions-set-aside")
        assert page.errors == []
    finally:
        stop_stack(running)
