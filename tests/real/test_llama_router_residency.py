"""A residency switch through ``turnout serve`` on llama-server in router mode, the real one (the pinned
build, the tiny qwen35 GGUF under two names) and the simulator's: the GPUs go from one model to the
other and back, a session's slot is saved before the unload and restored after the load, so its next
turn is still warm (issue #62 items 1 and 2; docs/residency.md)."""

from __future__ import annotations

import time
from collections.abc import Iterator
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

import httpx
import pytest
import yaml

from backends.sim import SimConfig
from backends.sim.llama_router import create_router_app
from gateway.app import create_app
from gateway.settings import load_settings
from tests.deploy.compose_run import REPO, Substitution, command_line, mount, replace_text, substitute
from tests.real.compose_services import ComposeLlama
from tests.real.conftest import qwen35_model
from tests.real.llama_server import LlamaRouterServer
from tests.servers import ADMIN, serve

SESSION = {"x-session-id": "router-agent"}
ROUTER_OVERRIDE = yaml.safe_load((REPO / "deploy" / "residency" / "compose.yaml").read_text())


@dataclass
class Router:
    base_url: str
    slot_dir: Path


@pytest.fixture(params=["sim", "real"])
def router(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[Router]:
    """The router: the simulator's (``backends.sim.llama_router``) or the real llama-server's, each
    over the models ``q27`` and ``flash``; the same test pins the simulator to the real thing."""
    slots = tmp_path / "slots"
    slots.mkdir()
    if request.param == "sim":
        config = SimConfig(kind="llamacpp", slots=2, time_scale=0.002, slot_save_path=str(slots))
        app = create_router_app({n: replace(config, model=n) for n in ("q27", "flash")})
        with serve(app) as server:
            yield Router(server.url, slots)
        return
    binary, gguf = request.getfixturevalue("llama_binary"), request.getfixturevalue("qwen35_gguf")
    models = tmp_path / "models"
    models.mkdir()
    for name in ("q27", "flash"):  # one GGUF under two names: two models of the router
        (models / f"{name}.gguf").symlink_to(gguf)
    real = LlamaRouterServer(binary, models, slot_dir=slots, log_path=tmp_path / "router.log").start()
    try:
        yield Router(real.base_url, slots)
    finally:
        real.stop()


def status(url: str, model: str) -> str:
    entries = httpx.get(url + "/models", timeout=10).json()["data"]
    return str(next(e for e in entries if e["id"] == model)["status"]["value"])


def until(predicate: Any, timeout: float = 120.0) -> None:
    deadline = time.monotonic() + timeout
    while not predicate():
        assert time.monotonic() < deadline, "timed out"
        time.sleep(0.05)


def switched(client: httpx.Client, target: str) -> dict[str, Any]:
    accepted = client.post("/admin/api/residency/cards", json={"wake": target}, headers=ADMIN)
    assert accepted.status_code == 202, accepted.text
    state: dict[str, Any] = {}

    def done() -> bool:
        state.update(client.get("/admin/api/residency", headers=ADMIN).json()["data"][0])
        return state["switch"] is None

    until(done)
    last: dict[str, Any] = state["history"][0]
    assert last["result"] == "done", last
    return last


def chat(client: httpx.Client, model: str, messages: list[dict[str, str]]) -> httpx.Response:
    body = {"model": model, "messages": messages, "max_tokens": 4, "temperature": 0}
    return client.post("/v1/chat/completions", json=body, headers=SESSION)


def test_a_switch_in_router_mode_unloads_loads_and_keeps_the_session_warm(router: Router) -> None:
    engine = {"url": router.base_url, "kind": "llamacpp", "probe_interval_s": 0.2, "timeouts": {"probe": 10}}
    settings = load_settings(
        None,
        backends=[{"id": "llama-q27", **engine}, {"id": "llama-flash", **engine}],
        models=[
            {"name": "q27", "architecture": "hybrid",
             "deployments": [{"backend": "llama-q27", "upstream_name": "q27"}]},
            {"name": "flash", "architecture": "hybrid",
             "deployments": [{"backend": "llama-flash", "upstream_name": "flash"}]},
        ],
        residency=[{"name": "cards", "members": [{"backend": "llama-q27"}, {"backend": "llama-flash"}],
                    "awake": "llama-q27", "step_timeout_s": 120}],
    )  # fmt: skip
    with serve(create_app(settings)) as gateway, httpx.Client(base_url=gateway.url, timeout=120) as client:
        until(lambda: status(router.base_url, "q27") == "loaded")  # at start: the awake member is loaded
        assert status(router.base_url, "flash") == "unloaded"
        until(lambda: client.get("/health").json()["backends"]["llama-q27"] == "ready")

        first = [
            {"role": "user", "content": "Tell me about the repository layout and the routing code. " * 6}
        ]
        one = chat(client, "q27", first)
        assert one.status_code == 200, one.text
        assert one.headers["x-turnout-backend"] == "llama-q27"
        answer = one.json()["choices"][0]["message"]

        there = switched(client, "llama-flash")
        assert set(there["steps_s"]) == {"drain", "free", "wake", "probe"}
        assert status(router.base_url, "q27") == "unloaded"
        assert status(router.base_url, "flash") == "loaded"
        assert list(router.slot_dir.iterdir())  # the session's slot, saved before the unload
        asleep = chat(client, "q27", first)
        assert asleep.status_code == 503
        assert "asleep: residency set 'cards' holds llama-flash awake" in asleep.json()["error"]["message"]
        other = chat(client, "flash", [{"role": "user", "content": "hello"}])
        assert other.status_code == 200, other.text
        assert other.headers["x-turnout-backend"] == "llama-flash"

        switched(client, "llama-q27")
        second = [*first, {"role": "assistant", "content": answer.get("content") or ""},
                  {"role": "user", "content": "And the tests?"}]  # fmt: skip
        two = chat(client, "q27", second)
        assert two.status_code == 200, two.text
        usage = two.json()["usage"]
    # the restored slot held the whole first turn: its prompt and answer are reused
    assert usage["prompt_tokens_details"]["cached_tokens"] >= one.json()["usage"]["prompt_tokens"]


def test_the_router_answers_as_llama_server_does(router: Router) -> None:
    """The router's own answers, and its errors, the same from the simulator as from the real one."""
    url = router.base_url
    with httpx.Client(base_url=url, timeout=60) as client:
        assert {e["id"]: e["status"]["value"] for e in client.get("/models").json()["data"]} == {
            "q27": "unloaded",
            "flash": "unloaded",
        }

        def refused(path: str, body: dict[str, Any], status: int = 400) -> str:
            answer = client.post(path, json=body)
            assert answer.status_code == status, answer.text
            return str(answer.json()["error"]["message"])

        assert refused("/v1/completions", {"prompt": "x"}) == "model name is missing from the request"
        assert refused("/v1/completions", {"model": "nope", "prompt": "x"}) == "model 'nope' not found"
        assert refused("/v1/completions", {"model": "q27", "prompt": "x"}) == "model is not loaded"
        assert refused("/models/unload", {"model": "q27"}) == "model is not running"
        assert refused("/models/load", {"model": "nope"}, 404) == "File Not Found"
        assert refused("/models/unload", {"model": "nope"}) == "model is not found"
        assert client.post("/models/load", json={"model": "q27"}).json() == {"success": True}
        until(lambda: status(url, "q27") == "loaded")
        assert refused("/models/load", {"model": "q27"}) == "model is already running"
        assert client.post("/models/load", json={"model": "flash"}).json() == {"success": True}
        until(lambda: status(url, "flash") == "loaded")  # --models-max 1: the other one makes room
        assert status(url, "q27") == "unloaded"
        slot = "/slots/0?action="
        assert refused(slot + "save", {"model": "flash", "filename": "../x.bin"}) == "Invalid filename"
        assert refused(slot + "nope", {"model": "flash", "filename": "a.bin"}) == "Invalid action"
        missing = refused(slot + "restore", {"model": "flash", "filename": "missing.bin"})
        assert missing.startswith("Unable to restore slot")
        saved = client.post(slot + "save", json={"model": "flash", "filename": "empty.bin"}).json()
        assert (saved["n_saved"], saved["filename"]) == (0, "empty.bin")


def test_the_compose_router_service_loads_each_preset(llama_binary: Path, tmp_path: Path) -> None:
    """deploy/residency/compose.yaml's llama-router, its command as Compose starts it and its presets as
    written, on the real llama-server: each preset loads (its flags accepted), answers, and unloads.
    Departures: a free loopback port, a temporary slot folder for the named volume, the presets' model
    paths pointed at the test model, one thread (docs/deploy.md lists them)."""
    service = ROUTER_OVERRIDE["services"]["llama-router"]
    model = qwen35_model(context=32768)  # a slot's window is ctx-size 32768 over parallel 2
    ini = tmp_path / "presets.ini"
    written = (REPO / "deploy" / "residency" / "presets.ini").read_text()
    ini.write_text(
        replace_text(
            written,
            {
                "/models/Qwen3.8-27B-Q4_K_M.gguf": str(model),
                "/models/UD-Q4_K_XL/Qwen3.8-Flash-Next-UD-Q4_K_XL-00001-of-00003.gguf": str(model),
            },
        )
    )
    (tmp_path / "slots").mkdir()
    env = {"MODELS_DIR": str(model.parent), "LLAMA_THREADS": "1"}

    def argv_for(port: int) -> list[str]:
        argv = mount(
            command_line(service, env, image_entrypoint=[str(llama_binary)]), service["volumes"], env
        )
        return substitute(
            argv,
            (
                Substitution("--host", "0.0.0.0", "127.0.0.1", "tests bind loopback only"),
                Substitution("--port", "8081", str(port), "a free port"),
                Substitution("--models-preset", str(REPO / "deploy/residency/presets.ini"), str(ini),
                             "the presets' model paths point at the test model"),
                Substitution("--slot-save-path", "/slots/", f"{tmp_path / 'slots'}/", "a named volume"),
            ),
        )  # fmt: skip

    server = ComposeLlama(argv_for, log_path=tmp_path / "router.log")
    server.start()
    try:
        url = server.base_url
        with httpx.Client(base_url=url, timeout=120) as client:
            names = {e["id"] for e in client.get("/models").json()["data"]}
            assert names == {"qwen3.8-27b-gguf", "qwen3.8-flash-next-gpu"}
            for name in sorted(names):
                assert client.post("/models/load", json={"model": name}).json() == {"success": True}
                until(lambda name=name: status(url, name) == "loaded")
                answer = client.post(
                    "/v1/completions", json={"model": name, "prompt": "hello", "max_tokens": 2}
                )
                assert answer.status_code == 200, answer.text
                props = client.get("/props", params={"model": name}).json()
                assert props["default_generation_settings"]["n_ctx"] == 16384  # ctx-size over parallel
            assert sum(status(url, n) == "loaded" for n in names) == 1  # --models-max 1
    finally:
        server.stop()
