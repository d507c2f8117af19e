"""structlog setup for the worker: one JSON object per line on stderr, with
job id, attempt and worker bound by the caller. Prompts and outputs are never
logged unless INFERQ_LOG_PROMPTS is set (the worker passes it through)."""
from __future__ import annotations

import logging as std_logging
import sys

import structlog


def configure(level: str = "info", json: bool = True) -> None:
    lvl = std_logging.getLevelName(level.upper())
    if not isinstance(lvl, int):
        raise ValueError(f"unknown log level {level!r}")
    renderer = structlog.processors.JSONRenderer() if json else structlog.dev.ConsoleRenderer(colors=False)
    structlog.configure(
        processors=[
            structlog.contextvars.merge_contextvars,
            structlog.processors.add_log_level,
            structlog.processors.TimeStamper(fmt="iso", utc=True),
            structlog.processors.format_exc_info,
            renderer,
        ],
        wrapper_class=structlog.make_filtering_bound_logger(lvl),
        logger_factory=structlog.PrintLoggerFactory(file=sys.stderr),
        cache_logger_on_first_use=False,
    )
    # The engine logs through the standard library: send it to the same stream.
    std_logging.basicConfig(stream=sys.stderr, level=lvl, format="%(levelname)s %(name)s: %(message)s")


def get_logger(**bound):
    return structlog.get_logger("inferq").bind(**bound)
