"""Error tree, close codes and the one close table, shared by the gateway and its clients.

Every error carries the wire ``code`` it is reported with and the WebSocket close
code used when it ends the connection.

Why the gateway closes a socket is one table, for every endpoint and wire protocol. Each
way a socket can end has a label, the same as in logs and metrics
(``connection_refused label=...``). ``closing(label)`` gives its close code and the reason
sent with it, so every module, and every codec (v1 and the OpenAI-compatible one), closes
the same way for the same cause. A refusal caused by an error takes the error's own close
code (``GatewayError.close_code``) and message: ``of_error``. The close-code table in
docs/protocol.md documents these rows.
"""

from __future__ import annotations

import enum
from typing import Literal, NamedTuple

__all__ = [
    "CloseCode",
    "Closing",
    "ConfigError",
    "ErrorCode",
    "GatewayError",
    "LimitExceeded",
    "ProtocolViolation",
    "ProviderError",
    "StoreUnavailable",
    "TooManySessions",
    "ToolError",
    "closing",
    "of_error",
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


# --------------------------------------------------------------------- the close table


class Closing(NamedTuple):
    """A close: its code, its reason (at most 123 bytes on the wire), its label."""

    code: CloseCode
    reason: str
    label: str


_CLOSES: dict[str, tuple[CloseCode, str]] = {
    # Refused at the handshake (1008: HTTP 403 there, no reason; others after an accept).
    "foreign_host": (CloseCode.POLICY, ""),
    "forbidden_origin": (CloseCode.FORBIDDEN_ORIGIN, "origin not allowed"),
    "bad_subprotocol": (CloseCode.POLICY, ""),
    "shutting_down": (CloseCode.SERVICE_RESTART, "shutting down"),
    "too_many_sockets": (CloseCode.TRY_AGAIN, "too many sockets from this address"),
    # Refused at the first frame.
    "first_message_timeout": (CloseCode.POLICY, "no session.start or session.resume in time"),
    "invalid_resume": (CloseCode.POLICY, "invalid session.resume"),
    "session_expired": (CloseCode.SESSION_EXPIRED, "session ended or expired"),
    "unknown_session": (CloseCode.UNKNOWN_SESSION, "unknown session"),
    "not_owner": (CloseCode.UNAUTHORIZED, "not the session's owner"),
    "wrong_resume_token": (CloseCode.UNAUTHORIZED, "wrong resume token"),
    "store_unavailable": (CloseCode.TRY_AGAIN, "the session store does not answer; try again"),
    "too_many_sessions": (CloseCode.TOO_MANY_SESSIONS, "too many sessions for this client"),
    "gateway_full": (CloseCode.TRY_AGAIN, "gateway full: try again later"),
    # A live socket.
    "message_flood": (CloseCode.POLICY, "message flood"),
    "client_too_slow": (CloseCode.TRY_AGAIN, "client too slow: resume to get the rest"),
    "not_reading": (CloseCode.TRY_AGAIN, "client not reading: resume to get the rest"),
    "no_pong": (CloseCode.TRY_AGAIN, "no pong in time: resume to get the rest"),
    "session_moved": (CloseCode.TRY_AGAIN, "session moved to another node: resume"),
    "service_restart": (CloseCode.SERVICE_RESTART, "service restart"),
    "taken_over": (CloseCode.TAKEN_OVER, "session taken over by a new socket"),
    "session_ended": (CloseCode.NORMAL, "session ended"),
    "done": (CloseCode.NORMAL, ""),
    "internal": (CloseCode.INTERNAL, ""),  # our bug: never a reason
}


def closing(label: str, reason: str | None = None) -> Closing:
    """The close for ``label``; ``reason`` replaces its usual one (a detail only the caller
    knows: which origin, which field of a bad ``session.resume``)."""
    code, usual = _CLOSES[label]
    return Closing(code, usual if reason is None else reason, label)


def of_error(exc: GatewayError, label: str) -> Closing:
    """The close for a refusal an error caused: its ``close_code``, its message."""
    return Closing(exc.close_code, str(exc), label)
