"""turnout's version: installed, or from a source checkout that was never installed."""

from __future__ import annotations

import importlib.metadata
import os
import shutil
import subprocess
import sys
import sysconfig
import time
import tomllib
from pathlib import Path

import httpx
import pytest

from gateway import version as version_module
from gateway.app import create_app
from gateway.settings import Settings
from gateway.version import PYPROJECT, UNKNOWN, turnout_version, version_in
from tests.real.llama_server import free_port

REPO = Path(__file__).resolve().parents[2]
DECLARED = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]["version"]


@pytest.fixture
def not_installed(monkeypatch: pytest.MonkeyPatch) -> None:
    """``PYTHONPATH=. python -m gateway``: no ``turnout`` distribution metadata anywhere."""

    def missing(name: str) -> str:
        raise importlib.metadata.PackageNotFoundError(name)

    monkeypatch.setattr(version_module, "version", missing)
    turnout_version.cache_clear()
    yield
    turnout_version.cache_clear()


def test_installed_turnout_reports_its_distribution_version() -> None:
    turnout_version.cache_clear()
    assert turnout_version() == importlib.metadata.version("turnout") == DECLARED


@pytest.mark.usefixtures("not_installed")
def test_a_source_checkout_falls_back_to_pyproject() -> None:
    assert PYPROJECT == REPO / "pyproject.toml"
    assert turnout_version() == DECLARED


@pytest.mark.usefixtures("not_installed")
def test_the_app_builds_from_a_source_checkout() -> None:
    """It failed at start with ``PackageNotFoundError: turnout`` (the OpenAPI document's version)."""
    app = create_app(Settings())
    assert app.openapi_config is not None
    assert app.openapi_config.version == DECLARED


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ('[project]\nname = "turnout"\nversion = "1.2.3"\n', "1.2.3"),
        ('[project]\nname = "other"\nversion = "1.2.3"\n', UNKNOWN),
        ('[project]\nname = "turnout"\ndynamic = ["version"]\n', UNKNOWN),
        ("not toml [", UNKNOWN),
    ],
)
def test_version_in_reads_only_turnouts_own_static_version(tmp_path: Path, text: str, expected: str) -> None:
    pyproject = tmp_path / "pyproject.toml"
    pyproject.write_text(text)
    assert version_in(pyproject) == expected


def test_a_missing_pyproject_is_unknown_not_a_crash(tmp_path: Path) -> None:
    assert version_in(tmp_path / "pyproject.toml") == UNKNOWN


def test_python_m_gateway_serves_from_a_checkout_that_was_never_installed(tmp_path: Path) -> None:
    """``PYTHONPATH=. python -m gateway serve`` with the dependencies but no ``turnout`` distribution:
    site-packages without turnout's metadata and editable hook, and a copy of the source tree (a
    checkout that was built in has ``turnout.egg-info`` beside the packages)."""
    checkout = tmp_path / "checkout"
    for package in ("gateway", "backends", "policies"):
        shutil.copytree(REPO / package, checkout / package, ignore=shutil.ignore_patterns("__pycache__"))
    shutil.copy(REPO / "pyproject.toml", checkout / "pyproject.toml")
    site = Path(sysconfig.get_paths()["purelib"])
    bare = tmp_path / "site-packages"
    bare.mkdir()
    for entry in site.iterdir():
        if "turnout" not in entry.name.lower():
            (bare / entry.name).symlink_to(entry)
    port = free_port()
    config = tmp_path / "turnout.toml"
    config.write_text(
        f'port = {port}\n[[backends]]\nid = "v"\nkind = "vllm"\nurl = "http://127.0.0.1:{free_port()}"\n'
        '[[models]]\nname = "m"\n[[models.deployments]]\nbackend = "v"\nupstream_name = "m"\n'
    )
    env = {
        "PATH": os.environ["PATH"],
        "PYTHONPATH": f"{checkout}{os.pathsep}{bare}",
        "TURNOUT_LOG_FORMAT": "json",
    }
    version = subprocess.run(
        [sys.executable, "-S", "-m", "gateway", "--version"], env=env, cwd=tmp_path, capture_output=True,
        text=True, timeout=60, check=False,
    )  # fmt: skip
    assert (version.returncode, version.stdout.strip()) == (0, f"turnout {DECLARED}"), version.stderr
    server = subprocess.Popen(
        [sys.executable, "-S", "-m", "gateway", "serve", "--config", str(config)], env=env, cwd=tmp_path,
        stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
    )  # fmt: skip
    try:
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline and server.poll() is None:
            try:
                schema = httpx.get(f"http://127.0.0.1:{port}/schema/openapi.json", timeout=1).json()
                break
            except httpx.HTTPError:
                time.sleep(0.2)
        else:
            server.kill()
            raise AssertionError(f"turnout did not start:\n{server.communicate()[0][-3000:]}")
        assert schema["info"]["version"] == DECLARED
    finally:
        server.terminate()
        server.wait(timeout=30)
