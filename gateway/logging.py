"""structlog setup: JSON lines (or pretty output on a terminal), stdlib logs included."""

from __future__ import annotations

import logging
import sys
from typing import Any

import msgspec
import structlog

__all__ = ["configure_logging"]

_encoder = msgspec.json.Encoder()


def _serialize(obj: Any, **_: Any) -> str:
    return _encoder.encode(obj).decode()


def configure_logging(level: str = "info", *, json: bool | None = None) -> None:
    """Send structlog and stdlib (uvicorn) logs to stderr, as JSON unless on a tty."""
    as_json = not sys.stderr.isatty() if json is None else json
    shared: list[Any] = [
        structlog.contextvars.merge_contextvars,
        structlog.stdlib.add_log_level,
        structlog.stdlib.add_logger_name,
        structlog.processors.TimeStamper(fmt="iso", utc=True),
    ]
    renderer: Any = (
        structlog.processors.JSONRenderer(serializer=_serialize)
        if as_json
        else structlog.dev.ConsoleRenderer()
    )
    structlog.configure(
        processors=[*shared, structlog.stdlib.ProcessorFormatter.wrap_for_formatter],
        logger_factory=structlog.stdlib.LoggerFactory(),
        wrapper_class=structlog.stdlib.BoundLogger,
        cache_logger_on_first_use=True,
    )
    handler = logging.StreamHandler(sys.stderr)
    handler.setFormatter(
        structlog.stdlib.ProcessorFormatter(
            foreign_pre_chain=shared,
            processors=[
                structlog.stdlib.ProcessorFormatter.remove_processors_meta,
                structlog.processors.format_exc_info,
                renderer,
            ],
        )
    )
    root = logging.getLogger()
    root.handlers[:] = [handler]
    root.setLevel(level.upper())
