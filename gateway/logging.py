"""structlog set-up: JSON lines (console on a TTY), request id bound per request via contextvars.

Log values go in as keyword arguments; prompts, keys and raw headers are never logged.
"""

from __future__ import annotations

import logging
import sys
from pathlib import Path
from typing import Any, Literal, TextIO

import structlog


class TeeLogger:
    """Writes every line to ``file``, and warnings and worse also to ``console`` (``turnout demo``:
    the terminal keeps its banner in sight, the file keeps everything)."""

    def __init__(self, file: TextIO, console: TextIO) -> None:
        self._file, self._console = file, console

    def _quiet(self, message: str) -> None:
        self._file.write(message + "\n")
        self._file.flush()

    def _loud(self, message: str) -> None:
        self._quiet(message)
        self._console.write(message + "\n")
        self._console.flush()

    debug = info = msg = _quiet
    warning = warn = error = err = critical = exception = fatal = _loud


def configure_logging(
    fmt: Literal["auto", "json", "console"] = "auto", level: str = "info", file: Path | None = None
) -> None:
    """Configure structlog once, at start-up (the CLI calls this; tests may call it again). With
    ``file``, every line goes there (plain console lines) and only warnings and worse to stderr."""
    use_console = fmt == "console" or (fmt == "auto" and (file is not None or sys.stderr.isatty()))
    renderer: structlog.types.Processor = (
        structlog.dev.ConsoleRenderer(colors=file is None and sys.stderr.isatty())
        if use_console
        else structlog.processors.JSONRenderer()
    )
    factory: Any = structlog.PrintLoggerFactory(file=sys.stderr)
    if file is not None:
        file.parent.mkdir(parents=True, exist_ok=True)
        tee = TeeLogger(file.open("a", encoding="utf-8"), sys.stderr)
        factory = lambda *_: tee  # noqa: E731 (structlog calls the factory with the logger's name)
    structlog.configure(
        processors=[
            structlog.contextvars.merge_contextvars,
            structlog.processors.add_log_level,
            structlog.processors.TimeStamper(fmt="iso", utc=True),
            structlog.processors.format_exc_info,
            renderer,
        ],
        wrapper_class=structlog.make_filtering_bound_logger(logging.getLevelNamesMapping()[level.upper()]),
        logger_factory=factory,
        cache_logger_on_first_use=True,
    )
