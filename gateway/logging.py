"""structlog setup: JSON lines (or pretty output on a terminal), stdlib logs included.

A log line is never lost to a value: what msgspec cannot encode (an arbitrary object,
an exception, a dict with tuple keys, a cycle) is written as its ``repr``.

What is logged is the callers' business, with one rule for all: ids, names, sizes,
codes and durations, never user text, tool arguments or outputs, or secrets.
"""

from __future__ import annotations

import logging
import re
import sys
from collections.abc import MutableMapping
from typing import Any

import msgspec
import structlog

__all__ = ["configure_logging"]


def _safe_repr(obj: object) -> str:
    try:
        return repr(obj)
    except Exception:
        return f"<unrepresentable {type(obj).__name__}>"


_encoder = msgspec.json.Encoder(enc_hook=_safe_repr)


def _encodable(value: object) -> object:
    try:
        _encoder.encode(value)
    except Exception:  # unsupported keys, cycles...: keep the line, lose only the detail
        return _safe_repr(value)
    return value


def _serialize(obj: Any, **_: Any) -> str:
    """The event dict as one JSON line; each value that cannot be encoded becomes its repr."""
    try:
        return _encoder.encode(obj).decode()
    except Exception:
        return _encoder.encode({str(k): _encodable(v) for k, v in obj.items()}).decode()


_TOKEN_IN_URL = re.compile(r"([?&]token=)[^&\s\"']+")


def _redact_tokens(
    _: Any, __: str, event_dict: MutableMapping[str, Any]
) -> MutableMapping[str, Any]:
    """Mask ``?token=`` in stdlib lines: uvicorn logs WebSocket paths with their query."""
    event = event_dict.get("event")
    if isinstance(event, str) and "token=" in event:
        event_dict["event"] = _TOKEN_IN_URL.sub(r"\1[redacted]", event)
    return event_dict


class _BoundLogger(structlog.stdlib.BoundLogger):
    """stdlib's bound logger, but a debug or info line below the logger's level costs one
    check: the stock one builds and runs the processor chain first, only for
    ``filter_by_level`` to drop it (a few microseconds per line: a session's start logs
    several)."""

    def debug(self, event: str | None = None, *args: Any, **kw: Any) -> Any:
        if not self._logger.isEnabledFor(logging.DEBUG):
            return None
        return super().debug(event, *args, **kw)

    def info(self, event: str | None = None, *args: Any, **kw: Any) -> Any:
        if not self._logger.isEnabledFor(logging.INFO):
            return None
        return super().info(event, *args, **kw)


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
        # filter_by_level first: a line below the level costs one check, not the chain.
        processors=[
            structlog.stdlib.filter_by_level,
            *shared,
            structlog.stdlib.ProcessorFormatter.wrap_for_formatter,
        ],
        logger_factory=structlog.stdlib.LoggerFactory(),
        wrapper_class=_BoundLogger,
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
