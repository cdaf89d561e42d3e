"""The endpoints file (llm-d's file-discovery format): read, checked, and laid over the configured
backends; then a picker behind Envoy routing over two replicas that the file alone describes."""

from __future__ import annotations

import concurrent.futures
import subprocess
import sys
from collections import Counter
from pathlib import Path

import httpx
import pytest
import yaml

from backends.sim import SimConfig, create_sim_app
from gateway.epp.endpoints import EndpointsError, read_endpoints, with_endpoints
from gateway.epp.exchange import endpoint_address
from tests.e2e.conftest import stack_settings
from tests.epp.envoy import envoy_with_picker
from tests.servers import ServerThread

SETTINGS = stack_settings({"vllm": "http://127.0.0.1:1", "llama": "http://127.0.0.1:2"})


def write(tmp_path: Path, endpoints: object, name: str = "endpoints.yaml") -> Path:
    path = tmp_path / name
    path.write_text(yaml.safe_dump({"endpoints": endpoints}))
    return path


def test_endpoints_replicate_the_backend_their_label_names(tmp_path: Path) -> None:
    path = write(tmp_path, [
        {"name": "vllm-a", "address": "10.0.0.1", "port": "8000", "labels": {"turnout.dev/backend": "vllm"}},
        {"name": "vllm-b", "address": "10.0.0.2", "port": 8000, "namespace": "inference",
         "labels": {"turnout.dev/backend": "vllm"}},
    ])  # fmt: skip
    settings = with_endpoints(SETTINGS, read_endpoints(path))
    backends = {b.id: b for b in settings.backends}
    assert set(backends) == {"vllm-a", "vllm-b", "llama"}  # the pool replaced its template
    assert str(backends["vllm-b"].url) == "http://10.0.0.2:8000/"
    assert backends["vllm-a"].kind == SETTINGS.backends[0].kind
    assert backends["vllm-a"].probe_interval_s == SETTINGS.backends[0].probe_interval_s
    both = next(m for m in settings.models if m.name == "m-both")
    assert [(d.backend, d.upstream_name) for d in both.deployments] == [
        ("vllm-a", "up-vllm"), ("vllm-b", "up-vllm"), ("llama", "up-llama"),
    ]  # fmt: skip


def test_an_endpoint_named_as_a_backend_moves_it(tmp_path: Path) -> None:
    path = write(tmp_path, [{"name": "llama", "address": "10.0.0.9", "port": "8080"}], "endpoints.json")
    path.write_text('{"endpoints": [{"name": "llama", "address": "10.0.0.9", "port": "8080"}]}')
    settings = with_endpoints(SETTINGS, read_endpoints(path))
    assert [(b.id, str(b.url)) for b in settings.backends] == [
        ("vllm", "http://127.0.0.1:1/"), ("llama", "http://10.0.0.9:8080/"),
    ]  # fmt: skip


@pytest.mark.parametrize(
    ("endpoints", "message"),
    [
        ([{"name": "x", "address": "not-an-ip", "port": "1"}], "is not an IP address"),
        ([{"name": "llama", "address": "10.0.0.1", "port": "0"}], "is not a port number"),
        ([{"name": "llama", "address": "10.0.0.1", "port": "http"}], "is not a port number"),
        ([{"name": "llama", "address": "10.0.0.1"}], "missing required field `port`"),
        ([{"name": "llama", "address": "10.0.0.1", "port": "1", "weight": 3}], "unknown field `weight`"),
        ([{"name": "a", "address": "10.0.0.1", "port": "1"}] * 2, "name 'a' is used twice"),
        ([{"name": "mystery", "address": "10.0.0.1", "port": "1"}], "names no configured backend 'mystery'"),
        (
            [{"name": "v", "address": "10.0.0.1", "port": "1", "labels": {"turnout.dev/backend": "nope"}}],
            "its label turnout.dev/backend names no configured backend 'nope'",
        ),
        (
            [
                {
                    "name": "llama",
                    "address": "10.0.0.1",
                    "port": "1",
                    "labels": {"turnout.dev/backend": "vllm"},
                }
            ],
            "a configured backend has that id already",
        ),
    ],
)
def test_a_bad_endpoints_file_says_what_is_wrong(tmp_path: Path, endpoints: object, message: str) -> None:
    with pytest.raises(EndpointsError, match=message):
        with_endpoints(SETTINGS, read_endpoints(write(tmp_path, endpoints)))


def test_an_unreadable_or_oversized_file_is_refused(tmp_path: Path) -> None:
    with pytest.raises(EndpointsError, match="cannot read the endpoints file"):
        read_endpoints(tmp_path / "absent.yaml")
    big = tmp_path / "big.yaml"
    big.write_text("# " + "x" * (1 << 20))
    with pytest.raises(EndpointsError, match="larger than 1,048,576 bytes"):
        read_endpoints(big)
    broken = tmp_path / "broken.yaml"
    broken.write_text("endpoints: [")
    with pytest.raises(EndpointsError, match="not valid YAML"):
        read_endpoints(broken)


def test_turnout_epp_refuses_a_bad_endpoints_file_before_serving(tmp_path: Path) -> None:
    config = tmp_path / "turnout.toml"
    config.write_text('[[backends]]\nid = "vllm"\nkind = "vllm"\nurl = "http://127.0.0.1:1"\n')
    path = write(tmp_path, [{"name": "elsewhere", "address": "10.0.0.1", "port": "1"}])
    done = subprocess.run(
        [sys.executable, "-m", "gateway", "epp", "--config", str(config), "--endpoints", str(path),
         "--listen", "127.0.0.1:0"],
        capture_output=True, text=True, timeout=60,
    )  # fmt: skip
    assert done.returncode == 2
    assert "endpoint 'elsewhere': it names no configured backend 'elsewhere'" in done.stderr


def test_the_picker_routes_over_the_replicas_the_file_lists(tmp_path: Path) -> None:
    """Two vLLM engines the config knows only as one backend, ``vllm``; the file makes them a pool
    of two, and the picker spreads a burst of requests over both."""
    sims = [
        ServerThread(create_sim_app(SimConfig(kind="vllm", model="up-vllm", time_scale=0.05))).start()
        for _ in range(2)
    ]
    llama = ServerThread(
        create_sim_app(SimConfig(kind="llamacpp", model="up-llama", time_scale=0.002))
    ).start()
    try:
        endpoints = [
            {"name": f"vllm-{i}", "address": "127.0.0.1", "port": str(sim.port),
             "labels": {"turnout.dev/backend": "vllm"}}
            for i, sim in enumerate(sims)
        ]  # fmt: skip
        base = stack_settings({"vllm": "http://127.0.0.1:1", "llama": llama.url})
        settings = with_endpoints(base, read_endpoints(write(tmp_path, endpoints)))
        with envoy_with_picker(settings, tmp_path) as (envoy, _picker), httpx.Client(timeout=30) as client:

            def ask(n: int) -> httpx.Response:
                body = {
                    "model": "m-vllm",
                    "messages": [{"role": "user", "content": f"q{n} " * 300}],
                    "max_tokens": 64,
                }
                return client.post(envoy.url + "/v1/chat/completions", json=body)

            with concurrent.futures.ThreadPoolExecutor(6) as pool:
                answers = list(pool.map(ask, range(12)))
        assert all(a.status_code == 200 for a in answers), [a.text for a in answers if a.status_code != 200]
        served = Counter(a.headers["x-turnout-backend"] for a in answers)
        assert set(served) == {"vllm-0", "vllm-1"}, served
        assert {endpoint_address(s.url) for s in sims} == {f"127.0.0.1:{s.port}" for s in sims}
    finally:
        for server in [*sims, llama]:
            server.stop()
