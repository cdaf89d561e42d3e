"""Test-wide set-up: gateway log lines are not printed (tests that read them capture them); a real
redis-server per test module that asks for one (``redis_server``)."""

from __future__ import annotations

import os
from collections.abc import Iterator

import pytest
import structlog

from tests.redis_server import RedisServer
from tests.servers import ADMIN_TOKEN

os.environ.setdefault("TURNOUT_ADMIN__TOKEN", ADMIN_TOKEN)  # every gateway's settings read it


def pytest_configure() -> None:
    structlog.configure(logger_factory=structlog.ReturnLoggerFactory(), cache_logger_on_first_use=False)


@pytest.fixture(scope="module")
def redis_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[RedisServer]:
    """A real redis-server on a free loopback port, for the module (it skips, saying why, without one)."""
    server = RedisServer(tmp_path_factory.mktemp("redis")).start()
    try:
        yield server
    finally:
        server.stop()
