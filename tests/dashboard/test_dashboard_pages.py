"""The dashboard's pages on what happened: predictions against the truth, the slots and who held them,
what-if replays, what routing bought, warm-ups and the rate samples set aside."""

from __future__ import annotations

from typing import Any

import httpx
import openai

from gateway.admin.accuracy import MAX_DRAWN
from policies import EngineKind
from policies.decision import Outcome
from policies.types import Usage
from tests.dashboard.conftest import ask, log_in, screenshot
from tests.e2e.conftest import Stack, start_stack, stop_stack
from tests.servers import ADMIN


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
