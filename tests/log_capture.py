"""The gateway's log lines captured while a block runs, with the production context processor (so
``request_id`` is bound): what the observability and real-engine tests read."""

from __future__ import annotations

from collections.abc import Iterator, MutableMapping
from contextlib import contextmanager
from typing import Any

import structlog
from structlog.testing import LogCapture


@contextmanager
def capture_logs() -> Iterator[list[MutableMapping[str, Any]]]:
    capture = LogCapture()
    previous = structlog.get_config()
    structlog.configure(processors=[structlog.contextvars.merge_contextvars, capture])
    try:
        yield capture.entries
    finally:
        structlog.configure(**previous)
