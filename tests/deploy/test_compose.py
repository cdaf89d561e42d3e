"""The deployment, validated where no docker daemon and no GPU are: compose.yaml against the Compose
Specification's schema and our own rules, the engine flags against the engines the tests build, the
gateway's config against its parser, the `sim` profile's command run as it is, and the Grafana
dashboard against the metrics turnout exposes."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import jsonschema
import openai
import pytest
import yaml
from prometheus_client.parser import text_string_to_metric_families

from gateway.settings import load_settings
from tests.deploy.compose_run import command_line, healthcheck_argv, interpolate, run_healthcheck
from tests.real.llama_server import free_port

REPO = Path(__file__).resolve().parents[2]
COMPOSE = yaml.safe_load((REPO / "compose.yaml").read_text())
SERVICES: dict[str, Any] = COMPOSE["services"]
SCHEMA = json.loads((Path(__file__).parent / "data" / "compose-spec.json").read_text())


def option(command: list[str], flag: str) -> str:
    """The value after ``flag`` in an exec-form command (``--flag value``)."""
    return str(command[command.index(flag) + 1])


def test_compose_file_is_valid_against_the_compose_specification() -> None:
    jsonschema.Draft7Validator.check_schema(SCHEMA)  # the spec's schema is draft-07
    errors = [
        f"{'/'.join(map(str, e.absolute_path))}: {e.message}"
        for e in jsonschema.Draft7Validator(SCHEMA).iter_errors(COMPOSE)
    ]
    assert errors == []


def test_the_schema_check_catches_a_mistake() -> None:
    broken = {**COMPOSE, "services": {"vllm": {**SERVICES["vllm"], "gpu_memory": "14g"}}}
    assert not jsonschema.Draft7Validator(SCHEMA).is_valid(broken)


def test_every_image_is_pinned() -> None:
    for name, service in SERVICES.items():
        image = service["image"]
        tag = image.rsplit(":", 1)[-1] if ":" in image.rsplit("/", 1)[-1] else ""
        assert tag, f"{name}: image {image} has no tag"
        assert tag != "latest", f"{name}: image {image} is not pinned"


def test_every_long_running_service_has_a_healthcheck_and_a_restart_policy() -> None:
    for name, service in SERVICES.items():
        assert service.get("healthcheck", {}).get("test"), f"{name}: no healthcheck"
        assert service.get("restart") == "unless-stopped", name


def test_both_engines_reserve_both_gpus_and_the_profiles_keep_a_laptop_gpu_free() -> None:
    for name in ("vllm", "llama"):
        devices = SERVICES[name]["deploy"]["resources"]["reservations"]["devices"]
        assert devices == [{"driver": "nvidia", "device_ids": ["0", "1"], "capabilities": ["gpu"]}]
    sim = {name for name, s in SERVICES.items() if "sim" in s.get("profiles", ())}
    assert sim == {"turnout-sim", "redis"}
    assert not any("deploy" in SERVICES[name] for name in sim)
    assert all(s.get("profiles") for s in SERVICES.values())  # nothing starts unless its profile is asked for
    assert SERVICES["vllm"]["healthcheck"]["start_period"] == "900s"  # vLLM takes minutes to load
    assert SERVICES["turnout"]["depends_on"]["redis"]["condition"] == "service_healthy"
    # Redis only (docs/deploy.md, "Start-up order"): waiting on the engines would wait on vLLM's
    # health through llama's dependency on it, for as long as its first start takes
    assert set(SERVICES["turnout"]["depends_on"]) == {"redis"}


def test_engine_options_are_separate_items() -> None:
    """llama-server reads ``--flag value`` only (``--ctx-size=4096`` is "invalid argument"), so every
    engine option is its own item with its value in the next (tests/real/test_deploy_commands.py
    starts them)."""
    for name in ("vllm", "llama"):
        joined = [arg for arg in SERVICES[name]["command"] if arg.startswith("-") and "=" in arg]
        assert joined == [], f"{name}: {joined}"


def test_the_gateway_config_names_the_compose_services(monkeypatch: pytest.MonkeyPatch) -> None:
    mounted = SERVICES["turnout"]["volumes"][0].split(":")
    assert mounted[:2] == ["./deploy/turnout.toml", "/etc/turnout/turnout.toml"]
    monkeypatch.setenv("TURNOUT_HOST", "0.0.0.0")  # as the image sets it
    settings = load_settings(REPO / "deploy" / "turnout.toml")
    hosts = {b.id: (b.url.host, b.url.port) for b in settings.backends}
    assert hosts == {"vllm": ("vllm", 8000), "llama-moe": ("llama", 8080)}
    assert settings.state.url == "redis://redis:6379/0"  # the compose service turnout waits for
    grace = SERVICES["turnout"]["stop_grace_period"]
    assert int(grace.removesuffix("s")) > settings.limits.shutdown_grace_s  # drained before SIGKILL
    assert "redis" in SERVICES["turnout"]["depends_on"]
    served = {option(SERVICES["vllm"]["command"], "--served-model-name"),
              option(SERVICES["llama"]["command"], "--alias")}  # fmt: skip
    assert {d.upstream_name for m in settings.models for d in m.deployments} == served
    monkeypatch.delenv("TURNOUT_ADMIN__TOKEN")
    with pytest.raises(Exception, match=r"admin\.token: required"):  # the compose file must pass one
        load_settings(REPO / "deploy" / "turnout.toml")


def test_prometheus_scrapes_turnout_and_both_engines() -> None:
    config = yaml.safe_load((REPO / "deploy" / "prometheus.yml").read_text())
    targets = {c["job_name"]: c["static_configs"][0]["targets"] for c in config["scrape_configs"]}
    assert targets == {"turnout": ["turnout:8484"], "vllm": ["vllm:8000"], "llama": ["llama:8080"]}
    assert "--metrics" in SERVICES["llama"]["command"]


TURNOUT = Path(sys.executable).with_name("turnout")  # the image's ENTRYPOINT ["turnout"], installed here
TOOLS_PATH = (
    f"{Path(sys.executable).parent}{os.pathsep}{os.environ.get('PATH', '')}"  # `python` as in the image
)


@pytest.fixture(scope="module")
def sim_service() -> Iterator[str]:
    """The `sim` profile's turnout, run as its compose service runs it (the image's entrypoint, the
    service's command and environment), outside docker: bound to 127.0.0.1 on a free port instead of
    0.0.0.0:8484 (tests talk to loopback only)."""
    service = SERVICES["turnout-sim"]
    port = free_port()
    env = {**os.environ, **{k: interpolate(str(v), os.environ) for k, v in service["environment"].items()}}
    assert (env["TURNOUT_HOST"], env["TURNOUT_PORT"]) == ("0.0.0.0", "8484")
    env.update(TURNOUT_HOST="127.0.0.1", TURNOUT_PORT=str(port), TURNOUT_LOG_FORMAT="json")
    argv = command_line(service, env, image_entrypoint=[str(TURNOUT)])
    process = subprocess.Popen(argv, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    url = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline:
            try:
                if httpx.get(url + "/health", timeout=1).status_code == 200:
                    break
            except httpx.HTTPError:
                time.sleep(0.2)
        yield url
    finally:
        process.terminate()
        try:
            process.wait(timeout=15)
        except subprocess.TimeoutExpired:
            process.kill()


def test_the_sim_profile_healthcheck_passes_on_the_service_and_fails_without_it(sim_service: str) -> None:
    test = SERVICES["turnout-sim"]["healthcheck"]["test"]
    port = str(httpx.URL(sim_service).port)
    up = run_healthcheck(healthcheck_argv(test, {"127.0.0.1:8484": f"127.0.0.1:{port}"}), path=TOOLS_PATH)
    assert up.returncode == 0, up.stderr
    down = healthcheck_argv(test, {"127.0.0.1:8484": f"127.0.0.1:{free_port()}"})
    assert run_healthcheck(down, path=TOOLS_PATH).returncode != 0


def test_the_sim_profile_answers_the_openai_sdk(sim_service: str) -> None:
    client = openai.OpenAI(base_url=sim_service + "/v1", api_key="k", max_retries=0)
    answer = client.chat.completions.create(
        model="qwen3.8-27b", messages=[{"role": "user", "content": "Hello!"}], max_tokens=8
    )
    assert answer.choices[0].message.content


def test_every_metric_the_grafana_dashboard_queries_exists(sim_service: str) -> None:
    dashboard = json.loads((REPO / "deploy" / "grafana" / "dashboards" / "turnout.json").read_text())
    queried = {
        name
        for panel in dashboard["panels"]
        for target in panel["targets"]
        for name in re.findall(r"\b(turnout_[a-z_]+)", target["expr"])
    }
    client = openai.OpenAI(base_url=sim_service + "/v1", api_key="k", max_retries=0)
    client.chat.completions.create(
        model="qwen3.8-27b", messages=[{"role": "user", "content": "hi"}], max_tokens=4
    )
    exposed = {
        sample.name
        for family in text_string_to_metric_families(httpx.get(sim_service + "/metrics").text)
        for sample in family.samples
    }
    assert queried
    assert queried - exposed == set()
