"""Logging setup: structlog with JSON lines off a TTY (journald, files) and colour on a TTY.

Daemons call :func:`configure` once; modules use ``structlog.get_logger(__name__)`` and log events
with key/value context (``log.info("drained", node=..., reason=...)``) so every decision is
machine-readable in the journal.
"""

from __future__ import annotations

import logging
import sys
from typing import Any

import structlog


class _CurrentStderr:
    """Writes to whatever ``sys.stderr`` is at the moment of writing (not when logging was set up):
    a test harness or a daemonising wrapper may swap it, and a closed old stream must not break us."""

    def write(self, text: str) -> int:
        return sys.stderr.write(text)

    def flush(self) -> None:
        sys.stderr.flush()

    def isatty(self) -> bool:
        return sys.stderr.isatty()


def configure(level: str = "info", *, json: bool | None = None, stream: Any = None) -> None:
    stream = stream or _CurrentStderr()
    use_json = (not stream.isatty()) if json is None else json
    numeric = logging.getLevelNamesMapping().get(level.upper(), logging.INFO)
    renderer: Any = (
        structlog.processors.JSONRenderer()
        if use_json
        else structlog.dev.ConsoleRenderer(colors=stream.isatty())
    )
    structlog.configure(
        processors=[
            structlog.contextvars.merge_contextvars,
            structlog.processors.add_log_level,
            structlog.processors.TimeStamper(fmt="iso", utc=True),
            structlog.processors.StackInfoRenderer(),
            structlog.processors.format_exc_info,
            renderer,
        ],
        wrapper_class=structlog.make_filtering_bound_logger(numeric),
        logger_factory=structlog.PrintLoggerFactory(file=stream),
        cache_logger_on_first_use=False,
    )
    # Libraries that use stdlib logging (paho, amqtt, aiohttp) go to the same stream, quieter.
    logging.basicConfig(stream=stream, level=max(numeric, logging.WARNING), force=True)


def get_logger(name: str) -> Any:
    return structlog.get_logger(name)
