"""Where the demo keeps its files (issue #60 item 8): its running configuration, ports included, where
``turnout config check`` and ``turnout replay --backends`` can read it; and a folder of its own for a
second demo under the same home (two demos shared one traffic log, one rotating the other's recording).
"""

from __future__ import annotations

import subprocess
import sys
import tomllib
from pathlib import Path

import httpx
import pytest

from gateway.settings import load_settings
from tests.demo_process import running_demo

pytestmark = pytest.mark.timeout(180)


def test_the_demo_writes_its_running_config_and_a_second_demo_gets_its_own_folder(tmp_path: Path) -> None:
    with running_demo(tmp_path, TURNOUT_LOG_FORMAT="json") as first:
        config = tmp_path / "demo" / "turnout.toml"
        assert f"Its configuration, ports included: {config}" in first.banner
        settings = load_settings(config)
        assert {b.base_url for b in settings.backends} == set(first.simulators)
        assert tomllib.loads(config.read_text())["admin"]["token"] == first.token  # the file's own
        check = subprocess.run(
            [sys.executable, "-m", "gateway", "config", "check", str(config)],
            capture_output=True, text=True, timeout=60, check=False,
        )  # fmt: skip
        assert check.returncode == 0, check.stdout + check.stderr  # every simulator up and serving
        with running_demo(tmp_path, TURNOUT_LOG_FORMAT="json") as second:
            own = tmp_path / "demo-2"
            assert str(own / "traffic.jsonl") in second.banner
            assert str(own / "turnout.toml") in second.banner
            assert set(second.simulators).isdisjoint(first.simulators)
    with running_demo(tmp_path, TURNOUT_LOG_FORMAT="json") as again:  # the first one's folder is free
        assert str(tmp_path / "demo" / "traffic.jsonl") in again.banner


def test_opening_the_what_if_page_prints_no_warning(tmp_path: Path) -> None:
    """The demo's backends were copied with a plain string for their URL, and every page that read
    the configuration back (the what-if) printed pydantic's serializer warnings on the terminal."""
    terminal = tmp_path / "terminal.txt"
    with (
        terminal.open("w") as stderr,
        running_demo(tmp_path, stderr=stderr, TURNOUT_LOG_FORMAT="json") as demo,
    ):
        headers = {"authorization": f"Bearer {demo.token}"}
        for path in ("/admin/whatif", "/admin/api/whatif"):
            assert httpx.get(demo.url + path, headers=headers, timeout=30).status_code == 200
    said = terminal.read_text()
    assert "Warning" not in said, said
