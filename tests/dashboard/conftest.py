"""The admin dashboard in a real headless Chromium: Debian's ``chromium``, driven by Playwright through
``executable_path`` (Playwright's own browser download cannot run here). Skipped, with the reason
printed, where that browser is missing; ``make test`` installs it (``make browser``).

Screenshots of every page go to ``tests/artifacts/`` on each run.
"""

from __future__ import annotations

import shutil
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import openai
import pytest

from tests.e2e.conftest import Stack, start_stack, stop_stack
from tests.servers import ADMIN_TOKEN

CHROMIUM = "/usr/bin/chromium"
ARTIFACTS = Path(__file__).resolve().parents[1] / "artifacts"
HOSTILE = '<img src=x onerror="window.xss=1">'
"""A model name with markup in it: every page must show it as text."""


@pytest.fixture(scope="module")
def browser() -> Iterator[Any]:
    """Module-scoped: Playwright's sync API keeps an event loop running in this thread while it is
    open, and later tests call ``asyncio.run``."""
    if shutil.which(CHROMIUM) is None:
        reason = f"the dashboard tests need Debian's chromium at {CHROMIUM} (make browser installs it)"
        print(f"\nskipping dashboard tests: {reason}", file=sys.stderr)
        pytest.skip(reason)
    from playwright.sync_api import sync_playwright

    with sync_playwright() as playwright:
        browser = playwright.chromium.launch(
            executable_path=CHROMIUM,
            headless=True,
            args=[
                "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
                "--disable-background-networking", "--disable-component-update", "--disable-sync",
            ],
        )  # fmt: skip
        try:
            yield browser
        finally:
            browser.close()


@pytest.fixture
def page(browser: Any) -> Iterator[Any]:
    context = browser.new_context(viewport={"width": 1280, "height": 900})
    page = context.new_page()
    errors: list[str] = []
    page.on("pageerror", lambda error: errors.append(str(error)))
    page.on("dialog", lambda dialog: errors.append(f"dialog: {dialog.message}"))
    page.errors = errors
    try:
        yield page
    finally:
        context.close()


@pytest.fixture(scope="module")
def stack(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Stack]:
    traffic = tmp_path_factory.mktemp("traffic") / "traffic.jsonl"
    running = start_stack(
        record={"path": str(traffic), "on_start": False},
        extra_models=[
            {"name": HOSTILE, "deployments": [{"backend": "vllm", "upstream_name": "up-vllm"}]},
        ],
        groups=[{"name": "grp", "members": ["m-vllm", "m-llama"]}],
    )
    try:
        yield running
    finally:
        stop_stack(running)


def screenshot(page: Any, name: str) -> None:
    ARTIFACTS.mkdir(exist_ok=True)
    page.screenshot(path=str(ARTIFACTS / f"dashboard-{name}.png"), full_page=True)


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
