"""Test-wide set-up: gateway log lines are not printed (tests that read them capture them)."""

from __future__ import annotations

import os

import structlog

from tests.servers import ADMIN_TOKEN

os.environ.setdefault("TURNOUT_ADMIN__TOKEN", ADMIN_TOKEN)  # every gateway's settings read it


def pytest_configure() -> None:
    structlog.configure(logger_factory=structlog.ReturnLoggerFactory(), cache_logger_on_first_use=False)
