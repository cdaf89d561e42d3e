"""Test-wide set-up: gateway log lines are not printed (tests that read them capture them); a real
redis-server per test module that asks for one (``redis_server``); Hypothesis's settings profiles.

Hypothesis keeps every property but asserts nothing about the machine's speed: no per-example
deadline and no ``too_slow`` health check (a busy shared machine or CI generates slowly; the
properties are what is tested). The profile comes from ``TURNOUT_HYPOTHESIS_PROFILE``, else ``ci``
when ``CI`` is set, else ``dev``:

* ``dev``: a fresh seed each run, printed in the header; ``TURNOUT_HYPOTHESIS_SEED=N`` replays it.
* ``ci``: derandomized, the same examples every run: seed ``TURNOUT_HYPOTHESIS_SEED`` (default 0),
  printed, and no example database.
* ``long``: ``make properties``: ``TURNOUT_HYPOTHESIS_EXAMPLES`` examples per property (1,000), a
  fresh seed, printed.
"""

from __future__ import annotations

import os
import random
from collections.abc import Iterator
from typing import Any

import pytest
import structlog
from hypothesis import HealthCheck, core, settings

from tests.redis_server import RedisServer
from tests.servers import ADMIN_TOKEN

os.environ.setdefault("TURNOUT_ADMIN__TOKEN", ADMIN_TOKEN)  # every gateway's settings read it


settings.register_profile("dev", deadline=None, suppress_health_check=[HealthCheck.too_slow], print_blob=True)
settings.register_profile("ci", settings.get_profile("dev"), database=None)
settings.register_profile(
    "long",
    settings.get_profile("dev"),
    max_examples=int(os.environ.get("TURNOUT_HYPOTHESIS_EXAMPLES", "1000")),
)


def hypothesis_profile() -> str:
    return os.environ.get("TURNOUT_HYPOTHESIS_PROFILE") or ("ci" if os.environ.get("CI") else "dev")


def hypothesis_seed(profile: str) -> int:
    """The run's seed: ``TURNOUT_HYPOTHESIS_SEED``, else 0 in CI (derandomized), else a fresh one."""
    given = os.environ.get("TURNOUT_HYPOTHESIS_SEED")
    if given:
        return int(given)
    return 0 if profile == "ci" else random.SystemRandom().randrange(2**32)


def pytest_configure(config: pytest.Config) -> None:
    structlog.configure(logger_factory=structlog.ReturnLoggerFactory(), cache_logger_on_first_use=False)
    profile = hypothesis_profile()
    settings.load_profile(profile)
    if config.getoption("hypothesis_seed", None) is None:  # pytest --hypothesis-seed=N still wins
        core.global_force_seed = hypothesis_seed(profile)


def pytest_report_header(config: pytest.Config) -> str:
    seed = config.getoption("hypothesis_seed", None) or core.global_force_seed
    return (
        f"hypothesis: profile {settings.get_current_profile_name()!r}, seed {seed} "
        f"(TURNOUT_HYPOTHESIS_SEED={seed} replays this run's examples)"
    )


@pytest.fixture(autouse=True)
def _logging_restored(monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    """A test that configures the gateway's logging (``gateway.logging.configure_logging``, a bench
    script's ``main``) binds it to pytest's captured stderr, closed once the test ends, and the
    loggers it used would keep it (``cache_logger_on_first_use``): every later test logging there
    failed ("I/O operation on closed file", when tests/replay ran before tests/backends). Here no
    logger is cached, and the test's configuration goes with it."""
    before = structlog.get_config()
    configure = structlog.configure

    def uncached(**options: Any) -> None:
        configure(**{**options, "cache_logger_on_first_use": False})

    monkeypatch.setattr(structlog, "configure", uncached)
    yield
    if structlog.get_config() != before:
        configure(**before)


@pytest.fixture(scope="module")
def redis_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[RedisServer]:
    """A real redis-server on a free loopback port, for the module (it skips, saying why, without one)."""
    server = RedisServer(tmp_path_factory.mktemp("redis")).start()
    try:
        yield server
    finally:
        server.stop()
