"""What a new user hit on the dashboard (issue #60 item 5): a session page that threw when the session
held no slot, a predictions scatter without a y label, time axes that named only their ends."""

from __future__ import annotations

from typing import Any

import httpx

from policies.sessions import session_label
from tests.dashboard.conftest import screenshot
from tests.dashboard.test_dashboard import ask, log_in
from tests.e2e.conftest import Stack
from tests.servers import ADMIN


def test_the_session_page_of_a_session_without_a_slot_runs_without_an_error(page: Any, stack: Stack) -> None:
    ask(stack, model="m-vllm", **{"x-session-id": "no-slot"})  # vLLM only: no slot to hold
    label = session_label("h:no-slot")
    assert (
        httpx.get(f"{stack.url}/admin/api/sessions/{label}", headers=ADMIN, timeout=30).json()["holds"] == []
    )
    log_in(page, stack)
    page.goto(f"{stack.url}/admin/sessions/{label}")
    page.wait_for_load_state("networkidle")
    assert "holds no slot" in page.content()
    assert page.errors == []  # it threw "Cannot read properties of null (reading 'addEventListener')"


def test_the_time_charts_name_five_times_and_the_scatter_both_axes(page: Any, stack: Stack) -> None:
    for index in range(3):
        ask(stack, **{"x-session-id": f"axes-{index}"})
    log_in(page, stack)
    page.wait_for_selector(".chart polyline.actual", state="attached")
    charts = page.locator(".chart svg")
    assert charts.count() >= 2
    for index in range(charts.count()):
        ticks = charts.nth(index).locator("text.tick").all_text_contents()
        assert len(ticks) == 3 + 5, ticks  # three values up the y axis, five times along the x axis
        times = ticks[3:]
        assert all(t.count(":") in (1, 2) for t in times), times  # HH:MM, HH:MM:SS over minutes
        assert times == sorted(times), times  # in order (seconds shown where the minutes would repeat)
        assert all(t.count(":") == 2 for t in times), times  # this chart spans seconds: HH:MM:SS
    screenshot(page, "overview-axes")
    page.goto(stack.url + "/admin/predictions")
    scatter = page.locator("svg.scatter").first
    labels = scatter.locator("text").all_text_contents()
    assert "predicted TTFT" in labels
    assert "actual TTFT" in labels
    screenshot(page, "predictions-axes")
    assert page.errors == []
