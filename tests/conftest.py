"""Test-wide set-up: gateway log lines are not printed (tests that read them capture them)."""

from __future__ import annotations

import structlog


def pytest_configure() -> None:
    structlog.configure(logger_factory=structlog.ReturnLoggerFactory(), cache_logger_on_first_use=False)
