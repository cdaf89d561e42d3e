"""The policy page switches a residency set's GPUs and shows how the switch went; the overview marks
the member that is asleep (issue #62; docs/residency.md). A stack of its own: two sleep-mode vLLM
simulators in the set ``cards``."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest

from tests.dashboard.conftest import screenshot
from tests.dashboard.test_dashboard import log_in
from tests.e2e.test_residency import Residency, running_cards, settled


@pytest.fixture(scope="module")
def cards() -> Iterator[Residency]:
    with running_cards() as running:
        yield running


def test_the_policy_page_switches_the_gpus_and_shows_each_step(page: Any, cards: Residency) -> None:
    log_in(page, cards)  # type: ignore[arg-type]  # it reads .url only
    page.goto(cards.url + "/admin/policy")
    section = page.locator("section.residency[data-set=cards]")
    assert section.locator("tr[data-member=vllm-a] td.state").inner_text() == "awake"
    assert section.locator("tr[data-member=vllm-b] td.state").inner_text() == "asleep"
    page.select_option("select.residency-target[data-set=cards]", "vllm-b")
    with page.expect_navigation(timeout=60_000):  # the page reloads once the switch has ended
        page.click("button.residency-switch[data-set=cards]")
    section = page.locator("section.residency[data-set=cards]")
    assert section.locator("tr[data-member=vllm-b] td.state").inner_text() == "awake"
    first = section.locator("table.residency-history tbody tr").first.inner_text()
    assert "vllm-a\tvllm-b" in first
    assert "done" in first
    screenshot(page, "policy-residency")
    page.goto(cards.url + "/admin")
    badge = page.locator("section.backend[data-backend=vllm-a] .health.asleep")
    badge.wait_for(timeout=10_000)
    assert badge.inner_text() == "asleep"
    screenshot(page, "overview-residency")
    with cards.client() as client:
        assert settled(client)["awake"] == "vllm-b"
    assert page.errors == []
