"""Every command line that README.md, docs/deploy.md and docs/agents.md hand a user, run as written.

Each line of their ``console`` blocks is in ``COMMANDS`` with the test that runs it, or with why it
cannot run here; a line added to the docs without either fails ``test_every_doc_command_is_run_or_says_why``.
They run through ``bash`` with the project venv's ``bin`` first on ``PATH`` (a user who installed turnout
has ``turnout`` there), in a scratch home and working directory, with these departures, and no other:

* the gateway's address ``127.0.0.1:8484`` (and docs/agents.md's remote ``gpu-box:8484``) becomes the
  test's free loopback port, given to turnout as ``TURNOUT_PORT`` (tests run side by side, and send
  traffic to loopback only);
* the README's complete ``turnout.toml`` is the ``turnout.toml`` of the working directory, its
  ``127.0.0.1:8000/8080/8081`` engines replaced by ``turnout sim`` engines on free ports that serve what
  the file says (names, windows, vLLM's API key).
"""

from __future__ import annotations

import json
import os
import re
import shutil
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import httpx
import pytest

from tests.deploy.compose_run import InterpolationError, interpolate
from tests.real.llama_server import free_port

REPO = Path(__file__).resolve().parents[2]
DOCS = ("README.md", "docs/deploy.md", "docs/agents.md")
VENV_BIN = Path(sys.executable).parent
GATEWAY = "127.0.0.1:8484"


@dataclass(frozen=True)
class NotRun:
    why: str


DOCKER = NotRun(
    "no docker daemon here: tests/real/test_deploy_commands.py runs each service's command as Compose "
    "passes it, and tests/deploy/test_compose.py runs the sim profile's"
)
RESIDENCY = NotRun(
    "the demo has no residency set: tests/e2e/test_residency.py (sleep-mode vLLM simulators) and "
    "tests/real/test_llama_router_residency.py (the real llama-server in router mode) send this switch "
    "to a gateway that has one"
)
COMMANDS: dict[str, str | NotRun] = {
    "make demo": "test_make_demo_serves_prints_its_dashboard_and_stops_on_ctrl_c",
    "make test": NotRun("it is the run this test is part of"),
    "curl -s http://127.0.0.1:8484/v1/chat/completions -H 'content-type: application/json' -d "
    """'{"model": "qwen3.8-27b", "messages": [{"role": "user", "content": "Hello!"}]}'""": "test_readme_curl",
    "turnout agents": "test_turnout_agents_against_the_demo",
    "turnout agents --agent claude-code": "test_turnout_agents_against_the_demo",
    "turnout agents --out ~/agent-settings": "test_turnout_agents_against_the_demo",
    "turnout agents --url http://gpu-box:8484 --model qwen3.8-27b --small-model qwen3.8-flash-next": (
        "test_turnout_agents_against_the_demo"
    ),
    "turnout agents --agent codex --out ~/agent-settings": "test_turnout_agents_against_the_demo",
    "turnout agents --config turnout.toml": "test_the_readme_config_file",
    "turnout serve --config turnout.toml": "test_the_readme_config_file",
    "turnout config check turnout.toml": "test_the_readme_config_file",
    "cp deploy/env.example .env": "test_env_example_is_what_compose_reads",
    "cp deploy/env.example .env && $EDITOR .env": "test_env_example_is_what_compose_reads",
    "turnout calibrate http://127.0.0.1:8080 --out llama-moe.toml --budget 10m": NotRun(
        "tests/real/test_calibrate.py runs it, as written but for the port and a shorter --budget, against"
        " the real llama-server the suite builds"
    ),
    "curl -s 127.0.0.1:8484/v1/chat/completions -H 'content-type: application/json' -d "
    """'{"model": "qwen3.8-27b", "messages": [{"role": "user", "content": "Hello!"}]}'""": "test_readme_curl",
    "sudo nvidia-ctk runtime configure --runtime=docker && sudo systemctl restart docker": NotRun(
        "no docker daemon and no GPU here (docs/deploy.md, step 2)"
    ),
    "docker run --rm --gpus all ubuntu nvidia-smi": NotRun("no docker daemon and no GPU here"),
    "docker compose --profile gpu up -d": DOCKER,
    "docker compose --profile gpu --profile monitoring up -d": DOCKER,
    "docker compose --profile sim up": DOCKER,
    "docker compose -f compose.yaml -f deploy/residency/compose.yaml --profile gpu up -d": DOCKER,
    """curl -X POST http://127.0.0.1:8484/admin/api/residency/cards -H "authorization: Bearer $TOKEN" """
    """-d '{"wake": "llama-27b"}'""": RESIDENCY,
    """curl -X POST http://127.0.0.1:8484/admin/api/residency/cards -H "authorization: Bearer """
    """$TURNOUT_ADMIN__TOKEN" -d '{"wake": "llama-27b"}'""": RESIDENCY,
}


def doc_commands() -> list[str]:
    """The command lines of the docs' console blocks: continuations joined, comments dropped."""
    found = []
    for doc in DOCS:
        for block in re.findall(r"```console\n(.*?)```", (REPO / doc).read_text(), flags=re.DOTALL):
            for line in block.replace("\\\n", " ").splitlines():
                command = " ".join(re.sub(r"\s+#\s.*$", "", line).split())
                if command:
                    found.append(command)
    return found


def readme_block(language: str) -> str:
    (block,) = re.findall(rf"```{language}\n(.*?)```", (REPO / "README.md").read_text(), flags=re.DOTALL)
    return block


@dataclass
class Shell:
    """Runs doc commands the way a user's shell would, at one gateway port."""

    port: int
    home: Path
    cwd: Path

    @property
    def env(self) -> dict[str, str]:
        env = {k: v for k, v in os.environ.items() if not k.startswith("TURNOUT_")}
        return {**env, "PATH": f"{VENV_BIN}{os.pathsep}{env.get('PATH', '')}", "HOME": str(self.home),
                "TURNOUT_PORT": str(self.port), "EDITOR": "true"}  # fmt: skip

    def address(self, text: str) -> str:
        return text.replace(GATEWAY, f"127.0.0.1:{self.port}").replace(
            "gpu-box:8484", f"127.0.0.1:{self.port}"
        )

    def run(self, command: str, timeout: float = 60) -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            ["bash", "-c", self.address(command)], cwd=self.cwd, env=self.env, capture_output=True, text=True,
            timeout=timeout, check=False,
        )  # fmt: skip


def test_every_doc_command_is_run_or_says_why() -> None:
    found = doc_commands()
    assert set(found) - set(COMMANDS) == set(), "a doc command that no test runs"
    assert set(COMMANDS) - set(found) == set(), "a command no doc has any more"
    tests = {name for name in COMMANDS.values() if isinstance(name, str)}
    assert tests <= set(globals()), tests - set(globals())


# --- make demo, and the commands that talk to it ------------------------------------------------


@dataclass
class Demo:
    process: subprocess.Popen[str]
    shell: Shell
    banner: str


@pytest.fixture(scope="module")
def demo(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Demo]:
    """``make demo`` in the repository, in its own process group as a terminal would run it."""
    home = tmp_path_factory.mktemp("home")
    shell = Shell(free_port(), home, home)
    env = {k: v for k, v in shell.env.items() if k != "TURNOUT_ADMIN__TOKEN"}
    process = subprocess.Popen(
        ["bash", "-c", "make demo"], cwd=REPO, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
        text=True, start_new_session=True,
    )  # fmt: skip
    assert process.stdout is not None
    banner = []
    for line in process.stdout:  # make's line, then the demo's banner up to "Ctrl-C ..."
        banner.append(line)
        if line.startswith("Ctrl-C"):
            break
    demo = Demo(process, shell, "".join(banner))
    try:
        _wait_healthy(f"http://127.0.0.1:{shell.port}", process)
        yield demo
    finally:
        if process.poll() is None:
            os.killpg(process.pid, signal.SIGTERM)
            process.wait(timeout=30)


def _wait_healthy(url: str, process: subprocess.Popen[str], timeout: float = 60) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        assert process.poll() is None, "the gateway exited"
        try:
            if httpx.get(url + "/health", timeout=1).status_code == 200:
                return
        except httpx.HTTPError:
            pass
        time.sleep(0.1)
    raise AssertionError(f"{url} not healthy in {timeout:.0f} s")


def test_readme_curl(demo: Demo) -> None:
    """The README's first request, and docs/deploy.md's first answer (the same, without ``http://``)."""
    curls = [c for c in doc_commands() if c.startswith("curl ") and "/v1/chat/completions" in c]
    assert len(curls) == 2
    for curl in curls:
        done = demo.shell.run(curl)
        assert done.returncode == 0, done.stderr
        answer = json.loads(done.stdout)
        assert answer["model"] == "qwen3.8-27b"
        assert answer["choices"][0]["message"]["content"]


def test_readme_python_sdk_snippet(demo: Demo) -> None:
    snippet = demo.shell.address(readme_block("python"))
    done = subprocess.run(
        [sys.executable, "-c", snippet],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
        env=demo.shell.env,
    )
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip()  # the streamed haiku, printed as it came


AGENT_HEADERS = ("## Claude Code", "## Codex CLI", "## OpenCode", "## aider")


def test_turnout_agents_against_the_demo(demo: Demo) -> None:
    shell, home = demo.shell, demo.shell.home
    everything = shell.run("turnout agents")
    assert everything.returncode == 0, everything.stderr
    assert [h for h in AGENT_HEADERS if h in everything.stdout] == list(AGENT_HEADERS)
    assert f'"ANTHROPIC_BASE_URL": "http://127.0.0.1:{shell.port}"' in everything.stdout

    claude = shell.run("turnout agents --agent claude-code")
    assert claude.returncode == 0, claude.stderr
    assert [h for h in AGENT_HEADERS if h in claude.stdout] == ["## Claude Code"]

    written = shell.run("turnout agents --out ~/agent-settings")
    assert written.returncode == 0, written.stderr
    assert {p.name for p in (home / "agent-settings").iterdir()} == {
        "claude-code",
        "codex",
        "opencode",
        "aider",
    }
    shutil.rmtree(home / "agent-settings")

    remote = shell.run(
        "turnout agents --url http://gpu-box:8484 --model qwen3.8-27b --small-model qwen3.8-flash-next"
    )
    assert remote.returncode == 0, remote.stderr
    assert '"ANTHROPIC_SMALL_FAST_MODEL": "qwen3.8-flash-next"' in remote.stdout

    codex = shell.run("turnout agents --agent codex --out ~/agent-settings")
    assert codex.returncode == 0, codex.stderr
    files = {p.name for p in (home / "agent-settings" / "codex").iterdir()}
    assert files == {"config.toml", "env.sh"}  # as docs/agents.md's comment says


def test_make_demo_serves_prints_its_dashboard_and_stops_on_ctrl_c(demo: Demo) -> None:
    """README: "it prints the dashboard's URL (/admin) and its admin token. Ctrl-C stops everything"."""
    url = f"http://127.0.0.1:{demo.shell.port}"
    assert f"{url}/admin" in demo.banner
    token = re.search(r"admin token: (\S+)\)", demo.banner)
    assert token is not None, demo.banner
    overview = httpx.get(url + "/admin/api/overview", headers={"authorization": f"Bearer {token.group(1)}"})
    assert overview.status_code == 200
    sims = re.findall(r"simulator on (http://127\.0\.0\.1:\d+)", demo.banner)
    assert len(sims) == 3
    os.killpg(demo.process.pid, signal.SIGINT)  # what Ctrl-C in the terminal sends: the whole group
    demo.process.wait(timeout=30)
    deadline = time.monotonic() + 10
    while _group_alive(demo.process.pid) and time.monotonic() < deadline:
        time.sleep(0.1)
    assert not _group_alive(demo.process.pid), "a process of make demo outlived Ctrl-C"
    for server in (url, *sims):
        with pytest.raises(httpx.ConnectError):
            httpx.get(server + "/health", timeout=1)


def _group_alive(pgid: int) -> bool:
    try:
        os.killpg(pgid, 0)
    except ProcessLookupError:
        return False
    return True


# --- the README's configuration file ------------------------------------------------------------

README_ENGINES = {  # the README's backends: url -> the simulator that serves what the file says
    "http://127.0.0.1:8000": ["vllm", "--model", "Qwen/Qwen3.8-27B-NVFP4", "--context-window", "94000",
                              "--api-key", "sk-local"],
    "http://127.0.0.1:8080": ["llamacpp", "--model", "qwen3.8-flash-next-ud-q4_k_xl", "--context-window",
                              "65536", "--slots", "2"],
    "http://127.0.0.1:8081": ["llamacpp", "--model", "qwen3.8-27b-q4_k_m", "--context-window", "65536",
                              "--slots", "2"],
}  # fmt: skip


@pytest.fixture
def readme_config(tmp_path: Path) -> Iterator[Shell]:
    """A working directory whose ``turnout.toml`` is the README's, on simulated engines."""
    text = readme_block("toml")
    sims = []
    try:
        for url, args in README_ENGINES.items():
            port = free_port()
            sims.append(subprocess.Popen(
                [str(VENV_BIN / "turnout"), "sim", *args, "--port", str(port), "--time-scale", "0.01"],
                stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
            ))  # fmt: skip
            assert f'url = "{url}"' in text
            text = text.replace(f'url = "{url}"', f'url = "http://127.0.0.1:{port}"')
            _wait_healthy(f"http://127.0.0.1:{port}", sims[-1], timeout=30)
        (tmp_path / "turnout.toml").write_text(text)
        yield Shell(free_port(), tmp_path, tmp_path)
    finally:
        for sim in sims:
            sim.terminate()
            sim.wait(timeout=15)


def test_the_readme_config_file(readme_config: Shell) -> None:
    shell = readme_config
    check = shell.run("turnout config check turnout.toml")
    assert check.returncode == 0, check.stdout + check.stderr
    assert "turnout.toml: valid (3 backends, 2 models)" in check.stdout

    agents = shell.run("turnout agents --config turnout.toml")
    assert agents.returncode == 0, agents.stderr
    assert '"CLAUDE_CODE_MAX_CONTEXT_TOKENS": "94000"' in agents.stdout  # the file's largest 27B window

    server = subprocess.Popen(
        ["bash", "-c", "exec turnout serve --config turnout.toml"], cwd=shell.cwd, env=shell.env,
        stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, text=True,
    )  # fmt: skip
    url = f"http://127.0.0.1:{shell.port}"  # TURNOUT_PORT over the file's port = 8484, as the README says
    try:
        _wait_healthy(url, server)
        for model, backends in (("qwen3.8-27b", {"vllm", "llama-27b"}), ("flash-next", {"llama-moe"})):
            answer = httpx.post(
                url + "/v1/chat/completions",
                json={"model": model, "messages": [{"role": "user", "content": "Hello!"}], "max_tokens": 8},
                timeout=30,
            )
            assert answer.status_code == 200, answer.text
            assert answer.headers["x-turnout-backend"] in backends
    finally:
        server.terminate()
        server.wait(timeout=40)


# --- the .env ------------------------------------------------------------------------------------


def test_env_example_is_what_compose_reads(tmp_path: Path) -> None:
    """``cp deploy/env.example .env``: the copy names every variable compose.yaml reads, and (unedited)
    Compose refuses to start turnout without the admin token it must be given."""
    (tmp_path / "deploy").mkdir()
    shutil.copy(REPO / "deploy" / "env.example", tmp_path / "deploy" / "env.example")
    shell = Shell(free_port(), tmp_path, tmp_path)
    for command in ("cp deploy/env.example .env", "cp deploy/env.example .env && $EDITOR .env"):
        done = shell.run(command)
        assert done.returncode == 0, done.stderr
    dotenv = {}
    for line in (tmp_path / ".env").read_text().splitlines():
        if "=" in line and not line.lstrip().startswith("#"):
            name, value = line.split("=", 1)
            dotenv[name.strip()] = re.sub(r"\s+#.*$", "", value).strip()  # Compose's inline comments
    compose_text = (REPO / "compose.yaml").read_text()
    used = set(re.findall(r"\$\{([A-Z0-9_]+)", compose_text))
    assert used - set(dotenv) == set(), "compose.yaml reads variables env.example does not name"
    assert dotenv["TURNOUT_ADMIN__TOKEN"] == ""  # the user fills it in
    with pytest.raises(InterpolationError, match="TURNOUT_ADMIN__TOKEN"):
        interpolate("${TURNOUT_ADMIN__TOKEN:?set TURNOUT_ADMIN__TOKEN in .env}", dotenv)
    assert "${TURNOUT_ADMIN__TOKEN:?set TURNOUT_ADMIN__TOKEN in .env}" in compose_text


def test_agents_doc_shows_the_exact_output_for_the_demo_config() -> None:
    """docs/agents.md: "This is the exact output for the demo configuration (`turnout agents --config
    gateway/demo.toml`)"."""
    text = (REPO / "docs" / "agents.md").read_text()
    block = re.search(r"exact output for the demo configuration.*?```text\n(.*?)```", text, flags=re.DOTALL)
    assert block is not None
    env = {k: v for k, v in os.environ.items() if not k.startswith("TURNOUT_")}
    done = subprocess.run(
        [str(VENV_BIN / "turnout"), "agents", "--config", "gateway/demo.toml"], cwd=REPO, env=env,
        capture_output=True, text=True, timeout=60, check=True,
    )  # fmt: skip
    assert done.stdout == block.group(1)
