"""The slot timeline over a quarter hour of agents (the screenshot docs/dashboard.md shows): three
sessions taking turns on two llama.cpp slots, evictions, a return from the RAM prompt cache, one-offs
with no slot, and vLLM's load as the probes saw it. The log is written straight into the gateway's
store, so the bars have the widths real agent turns have (the simulators answer in milliseconds)."""

from __future__ import annotations

import asyncio
import random
import time
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import pytest

from gateway.admin.slots import colour
from gateway.app import create_app
from gateway.settings import load_settings
from policies.sessions import session_label
from policies.types import BackendSnapshot, EngineKind, Health
from tests.dashboard.conftest import screenshot
from tests.servers import ADMIN_TOKEN, ServerThread


def decision(
    at: float, duration: float, session: str | None, slot: int | None, **chosen: Any
) -> dict[str, Any]:
    backend = "llama" if slot is not None or chosen.get("one_off") else "vllm"
    return {
        "at": at, "request_id": f"r{at:.0f}{session}", "model": "qwen3.8",
        "session": session and session_label(session), "session_name": session and session[2:],
        "chosen": backend, "slot": slot, "status": 200,
        "candidates": [{"backend": backend, "evicts": chosen.get("evicts"),
                        "cache_source": chosen.get("source", "slot"), "predicted_ttft_s": 1.0}],
        "outcome": {"duration_s": duration, "ttft_s": 1.0, "prompt_tokens": 20_000, "cached_tokens": 19_000},
    }  # fmt: skip


def agents(now: float) -> list[dict[str, Any]]:
    """Oldest first: agents a and b hold the slots, c takes a's, a comes back from RAM and takes b's."""
    rng = random.Random(7)
    out = []
    plan = [  # session, slot, from, to (seconds into the quarter hour)
        ("h:agent-a", 0, 0, 420),
        ("h:agent-b", 1, 30, 560),
        ("h:agent-c", 0, 440, 900),
        ("h:agent-a", 1, 600, 900),
    ]
    for session, slot, start, end in plan:
        at, first = now - 900 + start, True
        while at < now - 900 + end:
            duration = rng.uniform(12, 40)
            took = {"h:agent-c": session_label("h:agent-a"), "h:agent-a": session_label("h:agent-b")}
            evicts = took.get(session) if first and start > 0 else None
            source = "ram" if first and session == "h:agent-a" and start > 0 else "slot"
            out.append(decision(at + duration, duration, session, slot, evicts=evicts, source=source))
            at += duration + rng.uniform(5, 25)
            first = False
    for n in range(6):
        out.append(decision(now - 800 + n * 130, 6.0, None, None, one_off=True))
    return sorted(out, key=lambda e: e["at"])


@pytest.fixture
def quarter_hour() -> Iterator[str]:
    settings = load_settings(
        None,
        backends=[
            {"id": "vllm", "kind": "vllm", "url": "http://127.0.0.1:9", "probe_interval_s": 3600},
            {"id": "llama", "kind": "llamacpp", "url": "http://127.0.0.1:9", "probe_interval_s": 3600},
        ],
        models=[{"name": "qwen3.8", "architecture": "hybrid", "deployments": [
            {"backend": "vllm", "upstream_name": "q"}, {"backend": "llama", "upstream_name": "q"}]}],
    )  # fmt: skip
    app = create_app(settings)
    server = ServerThread(app).start()
    now = time.time()
    try:
        store = app.state.core.router.store

        async def fill() -> None:
            for entry in agents(now):
                await store.record_decision(entry)

        with ThreadPoolExecutor(1) as pool:  # Playwright keeps an event loop running in this thread
            pool.submit(asyncio.run, fill()).result()
        history = app.state.core.fleet.history
        for tick in range(0, 900, 2):
            load = 3 + round(2 * abs(((tick // 90) % 4) - 2))
            history.add(BackendSnapshot("vllm", EngineKind.VLLM, Health.READY, now - 900 + tick, running=load,
                                        queued=max(load - 5, 0)))  # fmt: skip
        yield server.url
    finally:
        server.stop()


def test_a_quarter_hour_of_agents_on_two_slots(page: Any, quarter_hour: str) -> None:
    page.goto(quarter_hour + "/admin/login")
    page.fill("input[name=token]", ADMIN_TOKEN)
    page.click("button")
    page.wait_for_url(quarter_hour + "/admin")
    page.goto(quarter_hour + "/admin/slots?minutes=15")
    llama = 'section.backend[data-backend="llama"]'
    lanes = page.locator(f"{llama} g.lane")
    assert [lanes.nth(i).get_attribute("data-slot") for i in range(lanes.count())] == ["0", "1", "any"]
    assert page.text_content(f'{llama} g.lane[data-slot="0"] text.label') == "slot 0 agent-c"
    assert page.text_content(f'{llama} g.lane[data-slot="1"] text.label') == "slot 1 agent-a"
    assert page.locator(f"{llama} path.evict").count() == 2
    assert page.locator(f"{llama} circle.restore").count() == 1
    assert page.locator(f'{llama} g.lane[data-slot="any"] a.bar').count() == 6
    first = [page.locator(f"{llama} g.lane[data-slot='{n}'] a.bar rect").first for n in (0, 1)]
    assert [bar.get_attribute("class") for bar in first] == [
        colour(session_label(f"h:agent-{s}")) for s in "ab"
    ]
    assert page.locator('section.backend[data-backend="vllm"] polyline.running').count() == 1
    assert page.locator(".log-from").count() == 0  # the log is not full: it holds all there was
    screenshot(page, "slots-agents")
    assert page.errors == []
