"""structlog setup: JSON lines (or pretty output on a terminal), stdlib logs included."""

from __future__ import annotations

import logging
import re
import sys
from collections.abc import MutableMapping
from typing import Any

import msgspec
import structlog

__all__ = ["configure_logging"]

_encoder = msgspec.json.Encoder()


def _serialize(obj: Any, **_: Any) -> str:
    return _encoder.encode(obj).decode()


_TOKEN_IN_URL = re.compile(r"([?&]token=)[^&\s\"']+")


def _redact_tokens(
    _: Any, __: str, event_dict: MutableMapping[str, Any]
) -> MutableMapping[str, Any]:
    """Mask ``?token=`` in stdlib lines: uvicorn logs WebSocket paths with their query."""
    event = event_dict.get("event")
    if isinstance(event, str) and "token=" in event:
        event_dict["event"] = _TOKEN_IN_URL.sub(r"\1[redacted]", event)
    return event_dict


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
            foreign_pre_chain=[*shared, _redact_tokens],
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
