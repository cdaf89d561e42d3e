"""``docker compose --profile sim up`` runs ``turnout demo`` in the image: as uid 10001, whose home is
``/nonexistent`` (deploy/Dockerfile), with the image's environment. There the demo's cache folder
(``~/.cache/turnout/demo``) cannot be made; the demo used to exit 1 at that ``mkdir``, and compose
restarted it forever.

No docker daemon here, and the tests' interpreter lives under /root, which another uid cannot enter:
the image's command runs with the image's environment and a home where no ``mkdir`` can succeed, even
as root (a path under a regular file: ``NotADirectoryError``, where uid 10001 gets ``PermissionError``).
"""

from __future__ import annotations

import os
from pathlib import Path

import httpx
import pytest

from gateway.demo import demo_dir
from tests.demo_process import running_demo

pytestmark = pytest.mark.timeout(120)


def unwritable_home(tmp_path: Path) -> Path:
    blocker = tmp_path / "not-a-folder"
    blocker.write_text("a file: nothing can be made under it\n")
    return blocker / "nonexistent"


def test_the_demo_runs_as_the_image_runs_it_with_a_home_it_cannot_write(tmp_path: Path) -> None:
    home, temporary = unwritable_home(tmp_path), tmp_path / "tmp"
    temporary.mkdir()
    terminal = tmp_path / "terminal.txt"
    with (
        terminal.open("w") as stderr,
        running_demo(
            tmp_path,
            stderr=stderr,
            TURNOUT_CACHE="",  # unset: the image sets none
            HOME=str(home),
            TMPDIR=str(temporary),
            TURNOUT_LOG_FORMAT="json",  # the image's
        ) as demo,
    ):
        assert httpx.get(demo.url + "/health", timeout=10).status_code == 200
        answer = httpx.post(
            demo.url + "/v1/chat/completions",
            json={
                "model": "qwen3.8-27b",
                "messages": [{"role": "user", "content": "Hello!"}],
                "max_tokens": 8,
            },
            timeout=30,
        )
        assert answer.status_code == 200, answer.text
        assert demo.process.poll() is None
    said = terminal.read_text()
    fallback = temporary / f"turnout-{os.getuid()}" / "demo"
    assert f"{home / '.cache' / 'turnout' / 'demo'} cannot be used" in said
    assert str(fallback) in said
    assert (fallback / "turnout.log").is_file()  # its log went there
    assert str(fallback / "traffic.jsonl") in demo.banner  # and its recording
    assert "Traceback" not in said


def test_the_demo_folder_falls_back_to_the_users_own_temporary_folder(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.setenv("TURNOUT_CACHE", str(unwritable_home(tmp_path)))
    monkeypatch.setenv("TMPDIR", str(tmp_path))
    monkeypatch.setattr("tempfile.tempdir", None)  # gettempdir() reads TMPDIR again
    folder = demo_dir()
    assert folder.parent.parent == tmp_path
    assert folder.is_dir()
    assert "cannot be used" in capsys.readouterr().err
    monkeypatch.setenv("TURNOUT_CACHE", str(tmp_path / "cache"))
    assert demo_dir() == tmp_path / "cache" / "demo"  # a writable cache is used as it is
    assert os.access(tmp_path / "cache" / "demo", os.W_OK)
