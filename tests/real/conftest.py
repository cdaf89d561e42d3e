"""Fixtures for the tests that run a real ``llama-server`` on a tiny random ``qwen35`` model.

* ``llama_binary`` (session): the built ``llama-server`` (built on first use, 15-30 minutes).
  Skips when this platform cannot build it (not Linux, no cmake or C++ compiler); a build that
  starts and fails is an error, not a skip.
* ``qwen35_gguf`` (session): the generated model, cached under ``$TURNOUT_CACHE/models`` (default
  ``~/.cache/turnout``) keyed by generator version, seed and shape.
* ``llama_server`` (function): a factory that starts servers and stops them at teardown.
"""

from __future__ import annotations

import fcntl
import sys
from collections.abc import Generator, Iterator, Sequence
from pathlib import Path

import pytest

from tests.real.build_llama_server import cache_root, cannot_build_reason, ensure_llama_server
from tests.real.llama_server import DEFAULT_ALIAS, LlamaServer, LlamaServerFactory
from tests.real.vllm_conftest_fixtures import (  # noqa: F401  (pytest finds the fixtures by name)
    tiny_qwen3,
    tiny_qwen3next,
    vllm_python,
    vllm_server,
    vllm_server_module,
)

QWEN35_SEED = 0
QWEN35_LAYERS = 4
QWEN35_CONTEXT = 4096


@pytest.fixture(scope="session")
def llama_binary() -> Path:
    reason = cannot_build_reason()
    if reason is not None:
        print(f"\nskipping real llama-server tests: {reason}", file=sys.stderr)
        pytest.skip(reason)
    return ensure_llama_server()  # a failing build raises: the test errors


def qwen35_cache_path(
    seed: int = QWEN35_SEED, n_layer: int = QWEN35_LAYERS, context: int = QWEN35_CONTEXT
) -> Path:
    from tests.real.gguf_qwen35 import GENERATOR_VERSION

    name = f"tiny-qwen35-v{GENERATOR_VERSION}-seed{seed}-l{n_layer}-ctx{context}.gguf"
    return cache_root() / "models" / name


def qwen35_model(context: int = QWEN35_CONTEXT, shards: int = 1) -> Path:
    """The tiny model trained (by its metadata) for ``context`` tokens: llama-server caps a slot's
    window at the training context. With ``shards`` > 1, split as the big GGUFs are published
    (``<name>-00001-of-0000N.gguf`` ..., in a folder of their own): the first shard."""
    from tests.real.gguf_qwen35 import write_qwen35_gguf

    path = qwen35_cache_path(context=context)
    if shards > 1:
        path = path.parent / f"{path.stem}-split{shards}" / path.name
        first = path.with_name(f"{path.stem}-00001-of-{shards:05d}{path.suffix}")
    else:
        first = path
    if first.is_file():
        return first
    path.parent.mkdir(parents=True, exist_ok=True)
    with open(path.with_name(path.name + ".lock"), "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)  # another run may be writing it
        if not first.is_file():
            write_qwen35_gguf(
                path, seed=QWEN35_SEED, n_layer=QWEN35_LAYERS, context_length=context, shards=shards
            )
    return first


@pytest.fixture(scope="session")
def qwen35_gguf() -> Path:
    return qwen35_model()


@pytest.fixture
def llama_server(
    llama_binary: Path, qwen35_gguf: Path, tmp_path: Path, request: pytest.FixtureRequest
) -> Iterator[LlamaServerFactory]:
    """``llama_server(extra_args=["-lv", "4"])`` starts a server (2 slots, 4096 total ctx) on the
    tiny qwen35 model and returns it once ``/health`` is 200.  All are stopped at teardown; a
    failed test's server log tails are printed."""
    servers: list[LlamaServer] = []

    def start(
        *,
        model: Path | None = None,
        alias: str = DEFAULT_ALIAS,
        n_parallel: int = 2,
        ctx_total: int = 4096,
        extra_args: Sequence[str] = (),
        startup_timeout: float = 120.0,
    ) -> LlamaServer:
        server = LlamaServer(
            llama_binary,
            model or qwen35_gguf,
            log_path=tmp_path / f"llama-server-{len(servers)}.log",
            alias=alias,
            n_parallel=n_parallel,
            ctx_total=ctx_total,
            extra_args=extra_args,
            startup_timeout=startup_timeout,
        )
        servers.append(server)
        return server.start()

    yield start
    failed = _failed(request)
    for server in servers:
        server.stop()
        if failed:
            print(f"\n--- {server.log_path} (tail) ---\n{server.log_tail(60)}", file=sys.stderr)


@pytest.fixture(scope="module")
def llama_server_module(
    llama_binary: Path, qwen35_gguf: Path, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[LlamaServerFactory]:
    """Like ``llama_server``, but the servers live for the whole test module (one start, many tests)."""
    servers: list[LlamaServer] = []
    log_dir = tmp_path_factory.mktemp("llama-module")

    def start(
        *,
        alias: str = DEFAULT_ALIAS,
        n_parallel: int = 2,
        ctx_total: int = 4096,
        extra_args: Sequence[str] = (),
    ) -> LlamaServer:
        server = LlamaServer(
            llama_binary,
            qwen35_gguf,
            log_path=log_dir / f"llama-server-{len(servers)}.log",
            alias=alias,
            n_parallel=n_parallel,
            ctx_total=ctx_total,
            extra_args=extra_args,
        )
        servers.append(server)
        return server.start()

    yield start
    for server in servers:
        server.stop()


def _failed(request: pytest.FixtureRequest) -> bool:
    report = getattr(request.node, "rep_call", None)
    return report is None or bool(report.failed)


@pytest.hookimpl(wrapper=True, tryfirst=True)
def pytest_runtest_makereport(
    item: pytest.Item, call: pytest.CallInfo[None]
) -> Generator[None, pytest.TestReport, pytest.TestReport]:
    report = yield
    if report.when == "call":
        item.rep_call = report  # type: ignore[attr-defined]
    return report
