"""turnout's version: installed, or from a source checkout that was never installed."""

from __future__ import annotations

import importlib.metadata
import tomllib
from pathlib import Path

import pytest

from gateway import version as version_module
from gateway.app import create_app
from gateway.settings import Settings
from gateway.version import PYPROJECT, UNKNOWN, turnout_version, version_in

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
