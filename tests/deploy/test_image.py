"""deploy/Dockerfile, read (no docker daemon here), and the wheel its first stage builds, built."""

from __future__ import annotations

import re
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
DOCKERFILE = (REPO / "deploy" / "Dockerfile").read_text()


def stages() -> list[str]:
    return re.split(r"^FROM ", DOCKERFILE, flags=re.MULTILINE)[1:]


def test_two_stages_slim_runtime_without_compilers() -> None:
    build, runtime = stages()
    assert build.startswith("python:3.11-slim-bookworm AS build")
    assert runtime.startswith("python:3.11-slim-bookworm\n")
    assert "COPY --from=build /wheels /wheels" in runtime
    assert not re.search(r"apt-get|gcc|build-essential|g\+\+", runtime)


def test_runs_as_a_non_root_user_with_a_healthcheck_and_turnout_serve() -> None:
    runtime = stages()[1]
    user = re.search(r"^USER (\S+)$", runtime, flags=re.MULTILINE)
    assert user is not None
    assert user.group(1) not in ("root", "0")
    assert re.search(
        r"^HEALTHCHECK .*CMD .*127\.0\.0\.1:8484/health", runtime, flags=re.MULTILINE | re.DOTALL
    )
    assert 'ENTRYPOINT ["turnout"]' in runtime
    assert 'CMD ["serve"]' in runtime
    assert "TURNOUT_CONFIG=/etc/turnout/turnout.toml" in runtime


def test_dockerignore_sends_only_what_the_image_needs() -> None:
    rules = (REPO / ".dockerignore").read_text().split()
    assert rules[rules.index("*")] == "*"  # everything out, then back in by name
    allowed = {r[1:].rstrip("/") for r in rules if r.startswith("!")}
    assert allowed == {
        "pyproject.toml",
        "README.md",
        "gateway",
        "backends",
        "policies",
        "deploy/turnout.toml",
    }
    copied = set(re.findall(r"^COPY (?!--from)(\S+)", DOCKERFILE, flags=re.MULTILINE))
    assert copied <= allowed


@pytest.mark.timeout(300)
def test_the_wheel_carries_the_package_data(tmp_path: Path) -> None:
    """What the build stage installs: the dashboard's templates and script, Codex's prompt, the demo."""
    pip = [sys.executable, "-m", "pip", "wheel", "--no-deps", "--no-cache-dir", "-q"]
    subprocess.run([*pip, "-w", str(tmp_path), str(REPO)], check=True, timeout=280)
    (wheel,) = tmp_path.glob("turnout-*.whl")
    names = set(zipfile.ZipFile(wheel).namelist())
    needed = {
        "gateway/admin/templates/base.html", "gateway/admin/static/admin.js",
        "gateway/admin/static/admin.css", "gateway/agents/codex_prompt.md", "gateway/agents/NOTICE",
        "gateway/demo.toml", "gateway/py.typed",
    }  # fmt: skip
    assert needed - names == set()
    assert not any(n.startswith("tests/") for n in names)
