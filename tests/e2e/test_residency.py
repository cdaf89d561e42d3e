"""A residency set end to end on the simulators: two vLLMs in sleep mode sharing "the GPUs", switched
by an admin while a stream runs and requests wait; a failed wake puts the old member back and is
reported (issue #62 item 1; docs/residency.md)."""

from __future__ import annotations

import json
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any

import httpx
import pytest

from backends.sim import SimConfig, create_sim_app
from gateway.app import create_app
from gateway.settings import load_settings
from policies import Architecture
from tests.e2e.conftest import PROBE_TIMEOUT_S
from tests.servers import ADMIN, ServerThread

SCALE = 0.01  # a first level-1 sleep: 0.28 s, a wake 12 ms
MODEL = "m"


@dataclass
class Residency:
    gateway: ServerThread
    sims: dict[str, ServerThread]
    apps: dict[str, Any]

    @property
    def url(self) -> str:
        return self.gateway.url

    def client(self) -> httpx.Client:
        return httpx.Client(base_url=self.gateway.url, timeout=30)

    def sleeping(self, backend: str) -> bool:
        return bool(httpx.get(self.sims[backend].url + "/is_sleeping", timeout=10).json()["is_sleeping"])


def free_port() -> str:
    """A loopback URL where nothing listens (an engine that never answers a wake)."""
    import socket

    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return f"http://127.0.0.1:{sock.getsockname()[1]}"


@contextmanager
def running_cards() -> Iterator[Residency]:
    """``start_cards``, stopped on the way out (the e2e and dashboard tests' module fixture)."""
    running = start_cards()
    try:
        yield running
    finally:
        for server in (running.gateway, *running.sims.values()):
            server.stop()


@pytest.fixture(scope="module")
def cards() -> Iterator[Residency]:
    with running_cards() as running:
        yield running


def start_cards() -> Residency:
    """Two sleep-mode vLLM simulators and an engine that never answers, in the residency set
    ``cards`` (``vllm-a`` awake), behind a gateway."""
    sims, apps = {}, {}
    for name in ("vllm-a", "vllm-b"):
        config = SimConfig(
            kind="vllm",
            model="up",
            time_scale=SCALE,
            architecture=Architecture.HYBRID,
            enable_sleep_mode=True,
        )
        apps[name] = create_sim_app(config)
        sims[name] = ServerThread(apps[name]).start()
    engine = {"probe_interval_s": 0.2, "timeouts": {"probe": PROBE_TIMEOUT_S}}
    urls = {**{n: s.url for n, s in sims.items()}, "vllm-dead": free_port()}
    backends = [{"id": n, "kind": "vllm", "url": u, **engine} for n, u in urls.items()]
    deployments = [{"backend": n, "upstream_name": "up"} for n in urls]
    settings = load_settings(
        None,
        backends=backends,
        models=[{"name": MODEL, "architecture": "hybrid", "deployments": deployments}],
        residency=[
            {
                "name": "cards",
                "members": [{"backend": n} for n in urls],
                "awake": "vllm-a",
                "wait_s": 20,
                "step_timeout_s": 5,
            }
        ],
    )
    return Residency(ServerThread(create_app(settings)).start(), sims, apps)


def ask(client: httpx.Client, words: int = 20, max_tokens: int = 4) -> httpx.Response:
    body = {
        "model": MODEL,
        "max_tokens": max_tokens,
        "messages": [{"role": "user", "content": "word " * words}],
    }
    return client.post("/v1/chat/completions", json=body)


def residency(client: httpx.Client) -> dict[str, Any]:
    sets: list[dict[str, Any]] = client.get("/admin/api/residency", headers=ADMIN).json()["data"]
    return sets[0]


def switch(client: httpx.Client, target: str) -> httpx.Response:
    return client.post("/admin/api/residency/cards", json={"wake": target}, headers=ADMIN)


def settled(client: httpx.Client, timeout: float = 30.0) -> dict[str, Any]:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        state = residency(client)
        if state["switch"] is None:
            return state
        time.sleep(0.02)
    raise AssertionError(f"the switch did not end: {state}")


def test_at_start_only_the_awake_member_holds_the_gpus(cards: Residency) -> None:
    """The member that is not awake is put to sleep at start, and gets no request."""
    deadline = time.monotonic() + 30
    while not cards.sleeping("vllm-b") and time.monotonic() < deadline:
        time.sleep(0.02)
    assert cards.sleeping("vllm-b")
    assert not cards.sleeping("vllm-a")
    with cards.client() as client:
        for _ in range(3):
            answer = ask(client)
            assert answer.status_code == 200, answer.text
            assert answer.headers["x-turnout-backend"] == "vllm-a"
        health = client.get("/health").json()
        assert health["residency"]["cards"]["awake"] == "vllm-a"
        state = residency(client)
        assert state["members"] == ["vllm-a", "vllm-b", "vllm-dead"]


def test_a_switch_drains_frees_wakes_and_probes_and_cuts_no_stream(cards: Residency) -> None:
    """A stream running on the member that gives the GPUs back finishes whole; a request sent
    meanwhile waits for the new member, says how long, and is answered there."""
    with cards.client() as client:
        assert settled(client)["awake"] == "vllm-a"
        body = {"model": MODEL, "max_tokens": 3000, "stream": True, "ignore_eos": True,
                "messages": [{"role": "user", "content": "a long answer please"}]}  # fmt: skip
        chunks: list[str] = []
        started, ended = threading.Event(), threading.Event()

        def stream() -> None:
            with (
                httpx.Client(base_url=cards.gateway.url, timeout=60) as own,
                own.stream("POST", "/v1/chat/completions", json=body) as response,
            ):
                assert response.headers["x-turnout-backend"] == "vllm-a"
                for line in response.iter_lines():
                    if line.startswith("data: "):
                        chunks.append(line[6:])
                        started.set()
            ended.set()

        streamer = threading.Thread(target=stream)
        streamer.start()
        assert started.wait(30)
        accepted = switch(client, "vllm-b")
        assert accepted.status_code == 202, accepted.text
        assert not ended.is_set()  # the switch began while the stream ran (3,000 tokens: ~0.5 s)
        assert accepted.json()["from"] == "vllm-a"
        assert switch(client, "vllm-a").status_code == 409  # one switch of a set at a time
        waited = ask(client)  # no member is awake until vllm-b is: this one waits for it
        streamer.join(60)
        assert waited.status_code == 200, waited.text
        assert waited.headers["x-turnout-backend"] == "vllm-b"
        assert float(waited.headers["x-turnout-residency-wait"]) > 0
        state = settled(client)
    assert chunks[-1] == "[DONE]"  # the stream ended as the engine ended it
    finish = [
        json.loads(c)["choices"][0].get("finish_reason") for c in chunks[:-1] if json.loads(c)["choices"]
    ]
    assert finish[-1] == "length"  # all 3,000 tokens: the engine was not put to sleep under it
    assert state["awake"] == "vllm-b"
    last = state["history"][0]
    assert last["result"] == "done"
    assert set(last["steps_s"]) == {"drain", "free", "wake", "probe"}
    assert last["steps_s"]["drain"] > 0  # it waited for the stream
    assert cards.sleeping("vllm-a")
    assert not cards.sleeping("vllm-b")
    with cards.client() as client:
        assert ask(client).headers["x-turnout-backend"] == "vllm-b"


def test_a_failed_wake_puts_the_old_member_back_and_says_so(cards: Residency) -> None:
    with cards.client() as client:
        before = settled(client)["awake"]
        assert switch(client, "vllm-dead").status_code == 202
        state = settled(client)
        assert state["awake"] == before
        failed = state["history"][0]
        assert failed["result"] == "failed"
        assert "vllm-dead: wake" in failed["error"]
        assert not cards.sleeping(before)  # woken again
        answer = ask(client)
        assert answer.status_code == 200
        assert answer.headers["x-turnout-backend"] == before
        health = client.get("/health").json()["residency"]["cards"]
        assert health["last_switch"]["result"] == "failed"
        metrics = client.get("/metrics").text
        assert 'turnout_residency_switches_total{result="failed",set="cards"} 1.0' in metrics
        assert f'turnout_residency_awake{{backend="{before}",set="cards"}} 1.0' in metrics


def test_bad_switches_are_refused_with_the_reason(cards: Residency) -> None:
    with cards.client() as client:
        settled(client)
        unknown_set = client.post("/admin/api/residency/gpus", json={"wake": "vllm-a"}, headers=ADMIN)
        assert unknown_set.status_code == 404
        assert "no residency set 'gpus'" in unknown_set.json()["error"]["message"]
        unknown_member = switch(client, "llama")
        assert unknown_member.status_code == 404
        assert "vllm-a, vllm-b, vllm-dead" in unknown_member.json()["error"]["message"]
        bad = client.post("/admin/api/residency/cards", json={"to": "vllm-a"}, headers=ADMIN)
        assert bad.status_code == 400
        assert client.post("/admin/api/residency/cards", json={"wake": "vllm-a"}).status_code == 401


@contextmanager
def on_demand_cards(
    wrap: dict[str, Any] | None = None,
) -> Iterator[tuple[ServerThread, dict[str, ServerThread]]]:
    """Two models on two sleep-mode vLLMs that share the cards, woken on demand (``on_demand``):
    model ``a`` on ``vllm-a`` (awake at start), ``b`` on ``vllm-b``; ``wrap`` puts an ASGI layer in
    front of a simulator (an engine that fails)."""
    sims = {}
    for name in ("vllm-a", "vllm-b"):
        config = SimConfig(kind="vllm", model=f"up-{name}", time_scale=SCALE, enable_sleep_mode=True,
                           architecture=Architecture.HYBRID)  # fmt: skip
        app = create_sim_app(config)
        sims[name] = ServerThread((wrap or {}).get(name, lambda inner: inner)(app)).start()
    engine = {"probe_interval_s": 0.2, "timeouts": {"probe": PROBE_TIMEOUT_S}}
    settings = load_settings(
        None,
        backends=[{"id": n, "kind": "vllm", "url": s.url, **engine} for n, s in sims.items()],
        models=[
            {"name": n.removeprefix("vllm-"), "architecture": "hybrid",
             "deployments": [{"backend": n, "upstream_name": f"up-{n}"}]}
            for n in sims
        ],
        residency=[{"name": "cards", "members": [{"backend": n} for n in sims], "awake": "vllm-a",
                    "wait_s": 20, "step_timeout_s": 5, "on_demand": True}],
    )  # fmt: skip
    gateway = ServerThread(create_app(settings)).start()
    try:
        yield gateway, sims
    finally:
        for server in (gateway, *sims.values()):
            server.stop()


def chat(client: httpx.Client, model: str) -> httpx.Response:
    body = {"model": model, "max_tokens": 4, "messages": [{"role": "user", "content": "hi"}]}
    return client.post("/v1/chat/completions", json=body)


def test_on_demand_a_request_for_the_asleep_model_wakes_its_member() -> None:
    """A request for the model asleep wakes its member and is answered there after the wait it
    reports, as llama-swap swaps; the next request for the other model swaps back."""
    with on_demand_cards() as (gateway, sims), httpx.Client(base_url=gateway.url, timeout=30) as client:
        assert settled(client)["awake"] == "vllm-a"
        woke = chat(client, "b")
        assert woke.status_code == 200, woke.text
        assert woke.headers["x-turnout-backend"] == "vllm-b"
        assert float(woke.headers["x-turnout-residency-wait"]) > 0
        back = chat(client, "a")
        assert back.status_code == 200, back.text
        assert back.headers["x-turnout-backend"] == "vllm-a"
        state = settled(client)
        switches = [h for h in reversed(state["history"]) if h["by"] != "start"]  # not the start check
        assert [(h["to"], h["by"], h["result"]) for h in switches] == [
            ("vllm-b", "on-demand", "done"),
            ("vllm-a", "on-demand", "done"),
        ]
        assert state["on_demand"] is True
        page = client.get("/admin/policy", headers=ADMIN).text
        assert "On demand: a request for a model only an asleep member serves wakes it." in page
        metrics = client.get("/metrics").text
        assert 'turnout_residency_switches_total{result="done",set="cards"} 2.0' in metrics
        for name, awake in (("vllm-a", True), ("vllm-b", False)):
            asleep = httpx.get(sims[name].url + "/is_sleeping", timeout=10).json()["is_sleeping"]
            assert asleep is not awake, name


def failing_chat(inner: Any) -> Any:
    """``inner`` whose chat completions answer 503 (an engine that woke but cannot serve yet)."""

    async def app(scope: dict[str, Any], receive: Any, send: Any) -> None:
        if scope["type"] == "http" and scope["path"] == "/v1/chat/completions":
            body = json.dumps({"error": {"message": "not ready", "type": "server_error"}}).encode()
            await send({"type": "http.response.start", "status": 503,
                        "headers": [(b"content-type", b"application/json")]})  # fmt: skip
            await send({"type": "http.response.body", "body": body})
            return
        await inner(scope, receive, send)

    return app


def test_a_request_that_waited_keeps_its_wait_through_a_failure_and_waits_once() -> None:
    """The member woken for a request fails it before any byte: the request is routed again once
    (nothing else serves the model: 502, the engine answered 503), waits for no second switch,
    and what it waited stays on its record: ``turnout_residency_wait_seconds`` and the request's
    log count it (the re-route reset it)."""
    with (
        on_demand_cards(wrap={"vllm-b": failing_chat}) as (gateway, _),
        httpx.Client(base_url=gateway.url, timeout=30) as client,
    ):
        assert settled(client)["awake"] == "vllm-a"
        failed = chat(client, "b")
        assert failed.status_code == 502, failed.text
        assert "answered 503" in failed.text
        state = settled(client)
        switches = [h for h in state["history"] if h["by"] != "start"]
        assert [(h["to"], h["result"]) for h in switches] == [("vllm-b", "done")]  # one switch, one wait
        metrics = client.get("/metrics").text
        assert "turnout_residency_wait_seconds_count 1.0" in metrics
        assert "turnout_residency_wait_seconds_sum 0.0" not in metrics
