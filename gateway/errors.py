"""Error tree and close codes shared by the gateway and its clients.

Every error carries the wire ``code`` it is reported with and the WebSocket close
code used when it ends the connection.
"""

from __future__ import annotations

import enum
from typing import Literal

__all__ = [
    "CloseCode",
    "ConfigError",
    "ErrorCode",
    "GatewayError",
    "LimitExceeded",
    "ProtocolViolation",
    "ProviderError",
    "StoreUnavailable",
    "TooManySessions",
    "ToolError",
]

ErrorCode = Literal[
    "invalid_message",
    "unknown_type",
    "busy",
    "unknown_call",
    "invalid_result",
    "tool_timeout",
    "provider_error",
    "rate_limited",
    "unauthorized",
    "forbidden",
    "forbidden_origin",
    "message_too_large",
    "resume_gap",
    "session_expired",
    "max_steps_exceeded",
    "response_interrupted",
    "store_unavailable",
    "internal",
]


class CloseCode(enum.IntEnum):
    """WebSocket close codes the gateway uses (RFC 6455 ones and ours, 4000-4999)."""

    NORMAL = 1000
    GOING_AWAY = 1001
    INVALID_DATA = 1007  # a text frame that is not UTF-8: closed by the server library
    POLICY = 1008
    TOO_BIG = 1009
    INTERNAL = 1011  # our bug; never carries a reason
    SERVICE_RESTART = 1012
    TRY_AGAIN = 1013
    UNAUTHORIZED = 4001  # no, expired or forged credential; wrong resume token; not the owner
    FORBIDDEN_ORIGIN = 4003  # a browser page of an origin not allowed
    UNKNOWN_SESSION = 4004
    SESSION_EXPIRED = 4008
    TAKEN_OVER = 4009  # a session.resume on another socket took the session over
    TOO_MANY_SESSIONS = 4029  # the principal holds max_sessions_per_principal sessions


class GatewayError(Exception):
    """Base of every error the gateway raises on purpose."""

    code: ErrorCode = "internal"
    close_code: CloseCode = CloseCode.INTERNAL
    retryable: bool = False


class ProtocolViolation(GatewayError):
    """The peer broke the protocol in a way that ends the connection."""

    code: ErrorCode = "invalid_message"
    close_code = CloseCode.POLICY


class LimitExceeded(GatewayError):
    """The peer went over a size limit that ends the connection."""

    code: ErrorCode = "message_too_large"
    close_code = CloseCode.TOO_BIG


class ProviderError(GatewayError):
    """The model provider failed; the response ends, the session goes on."""

    code: ErrorCode = "provider_error"
    retryable = True


class ToolError(GatewayError):
    """A tool failed; the message becomes the tool's error result."""

    code: ErrorCode = "internal"


class ToolForbidden(ToolError):
    """A tool refuses its caller (another user's order, say): the call fails with the code
    ``forbidden`` (``tool.status``), and the model sees the message."""


class ConfigError(GatewayError):
    """The gateway's configuration (agent file, scenario, flags) is invalid."""


class TooManySessions(GatewayError):
    """A new session would go over a session quota (nil while the gateway shuts down): the
    socket is refused, nothing ends.

    Attributes:
        label: short snake_case reason for logs and metrics (``gateway_full``,
            ``too_many_sessions``, ``shutting_down``).
    """

    code: ErrorCode = "rate_limited"
    retryable = True

    def __init__(self, message: str, *, close_code: CloseCode, label: str) -> None:
        super().__init__(message)
        self.close_code = close_code
        self.label = label


class StoreUnavailable(GatewayError):
    """The session store (Redis) does not answer: the session cannot go on on this node now.

    The client should come back later (close 1013); nothing is lost that was committed.
    """

    code: ErrorCode = "store_unavailable"
    close_code = CloseCode.TRY_AGAIN
    retryable = True
