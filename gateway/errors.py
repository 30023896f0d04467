"""Error tree, close codes and the one close table, shared by the gateway and its clients.

Why the gateway closes a socket, and what it calls each failure, is one table for every
endpoint and wire protocol. Each cause has a label, the same as in logs and metrics
(``connection_refused label=...``). ``closing(label)`` gives its close code, the reason
sent with it and the wire error code that names the cause (``None`` for a close that no
failure causes: the session ended, moved or was taken over), so every module, and every
codec (v1 and the OpenAI-compatible one), closes the same way for the same cause.

Every ``GatewayError`` carries its label too: its ``code`` and its ``close_code`` are its
row's, and ``of_error`` gives the close of a refusal it caused. No error class holds a code
of its own. The close-code table in docs/protocol.md documents these rows.
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
    "ProviderError",
    "StoreUnavailable",
    "TooManySessions",
    "ToolError",
    "ToolForbidden",
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
"""The wire error codes (``error.code``) the gateway defines; docs/protocol.md lists them."""


class CloseCode(enum.IntEnum):
    """WebSocket close codes the gateway uses (RFC 6455 ones and ours, 4000-4999)."""

    NORMAL = 1000
    GOING_AWAY = 1001
    INVALID_DATA = 1007  # a text frame that is not UTF-8: closed by the server library
    POLICY = 1008
    TOO_BIG = 1009  # a frame over ws_max_size: closed by the server library
    INTERNAL = 1011  # our bug; never carries a reason
    SERVICE_RESTART = 1012
    TRY_AGAIN = 1013
    UNAUTHORIZED = 4001  # no, expired or forged credential; wrong resume token; not the owner
    FORBIDDEN_ORIGIN = 4003  # a browser page of an origin not allowed
    UNKNOWN_SESSION = 4004
    SESSION_EXPIRED = 4008
    TAKEN_OVER = 4009  # a session.resume on another socket took the session over
    TOO_MANY_SESSIONS = 4029  # the principal holds max_sessions_per_principal sessions


# --------------------------------------------------------------------- the close table


class Closing(NamedTuple):
    """A close: its code, its reason (at most 123 bytes on the wire), its label, and the
    wire error code of its cause (``None``: no failure caused it)."""

    code: CloseCode
    reason: str
    label: str
    error_code: ErrorCode | None


_CLOSES: dict[str, tuple[CloseCode, str, ErrorCode | None]] = {
    # Refused at the handshake (1008: HTTP 403 there, no reason; others after an accept).
    "foreign_host": (CloseCode.POLICY, "", "forbidden"),
    "forbidden_origin": (CloseCode.FORBIDDEN_ORIGIN, "origin not allowed", "forbidden_origin"),
    "bad_subprotocol": (CloseCode.POLICY, "", "invalid_message"),
    "shutting_down": (CloseCode.SERVICE_RESTART, "shutting down", "rate_limited"),
    "too_many_sockets": (CloseCode.TRY_AGAIN, "too many sockets from this address", "rate_limited"),
    # A credential refused (``AuthError``: its reason says precisely why).
    "no_token": (CloseCode.UNAUTHORIZED, "a credential is required", "unauthorized"),
    "no_key": (CloseCode.UNAUTHORIZED, "an API key is required", "unauthorized"),
    "bad_token": (CloseCode.UNAUTHORIZED, "invalid token", "unauthorized"),
    "bad_key": (CloseCode.UNAUTHORIZED, "unknown API key", "unauthorized"),
    "token_expired": (CloseCode.UNAUTHORIZED, "token expired", "unauthorized"),
    "wrong_agent": (CloseCode.UNAUTHORIZED, "token is for another agent", "unauthorized"),
    "wrong_origin": (CloseCode.UNAUTHORIZED, "token is bound to another origin", "unauthorized"),
    # Refused at the first frame.
    "first_message_timeout": (
        CloseCode.POLICY,
        "no session.start or session.resume in time",
        "invalid_message",
    ),
    "invalid_resume": (CloseCode.POLICY, "invalid session.resume", "invalid_message"),
    "session_expired": (CloseCode.SESSION_EXPIRED, "session ended or expired", "session_expired"),
    "unknown_session": (CloseCode.UNKNOWN_SESSION, "unknown session", "session_expired"),
    "not_owner": (CloseCode.UNAUTHORIZED, "not the session's owner", "unauthorized"),
    "wrong_resume_token": (CloseCode.UNAUTHORIZED, "wrong resume token", "unauthorized"),
    "store_unavailable": (
        CloseCode.TRY_AGAIN,
        "the session store does not answer; try again",
        "store_unavailable",
    ),
    "too_many_sessions": (
        CloseCode.TOO_MANY_SESSIONS,
        "too many sessions for this client",
        "rate_limited",
    ),
    "gateway_full": (CloseCode.TRY_AGAIN, "gateway full: try again later", "rate_limited"),
    # A live socket.
    "message_flood": (CloseCode.POLICY, "message flood", "rate_limited"),
    "client_too_slow": (CloseCode.TRY_AGAIN, "client too slow: resume to get the rest", None),
    "not_reading": (CloseCode.TRY_AGAIN, "client not reading: resume to get the rest", None),
    "no_pong": (CloseCode.TRY_AGAIN, "no pong in time: resume to get the rest", None),
    "session_moved": (CloseCode.TRY_AGAIN, "session moved to another node: resume", None),
    "service_restart": (CloseCode.SERVICE_RESTART, "service restart", None),
    "max_socket_age": (CloseCode.TRY_AGAIN, "socket reached its maximum age: resume", None),
    "taken_over": (CloseCode.TAKEN_OVER, "session taken over by a new socket", None),
    "session_ended": (CloseCode.NORMAL, "session ended", None),
    "done": (CloseCode.NORMAL, "", None),
    # Our bug: never a reason. Failures that end no socket (the model's, a tool's, the
    # configuration's) close like it, should one ever escape to the driver.
    "internal": (CloseCode.INTERNAL, "", "internal"),
    "provider_error": (CloseCode.INTERNAL, "", "provider_error"),
    "tool_error": (CloseCode.INTERNAL, "", "internal"),
    "tool_forbidden": (CloseCode.INTERNAL, "", "forbidden"),
    "config_error": (CloseCode.INTERNAL, "", "internal"),
    "invalid_token_request": (CloseCode.INTERNAL, "", "invalid_message"),
}


def closing(label: str, reason: str | None = None) -> Closing:
    """The close for ``label``; ``reason`` replaces its usual one (a detail only the caller
    knows: which origin, which field of a bad ``session.resume``).

    Raises:
        KeyError: no row has ``label``.
    """
    code, usual, error_code = _CLOSES[label]
    return Closing(code, usual if reason is None else reason, label, error_code)


def of_error(exc: GatewayError) -> Closing:
    """The close of a refusal ``exc`` caused: its label's row, with its own reason if it
    has one the peer may read (``GatewayError.close_reason``)."""
    return closing(exc.label, exc.close_reason)


# ------------------------------------------------------------------------ the errors


class GatewayError(Exception):
    """Base of every error the gateway raises on purpose.

    Its label is its row of the close table: the wire ``code`` it is reported with, and the
    code and reason a socket it ends (or refuses) closes with (``close_code``,
    ``of_error``).

    Args:
        *args: the message, as for any exception.
        label: a finer row than the class's own (``AuthError``: ``token_expired``...).

    Attributes:
        label: its row of the close table (``closing``).
        code: the wire error code of its row.
        close_reason: what a close it causes tells the peer instead of its row's usual
            reason: its own words, never a secret. ``None``: the usual reason (its message
            may hold what the peer must not read, such as the store's address).
        retryable: the same request may well work later.
    """

    label: str = "internal"
    code: ErrorCode
    close_reason: str | None = None
    retryable: bool = False

    def __init__(self, *args: object, label: str | None = None) -> None:
        super().__init__(*args)
        if label is not None:
            self.label = label
        # A close that no failure causes has no code; no error names such a row.
        self.code = _CLOSES[self.label][2] or "internal"

    @property
    def close_code(self) -> CloseCode:
        """The close code of a socket this error ends or refuses (its row's)."""
        return _CLOSES[self.label][0]


class ProviderError(GatewayError):
    """The model provider failed; the response ends, the session goes on."""

    label = "provider_error"
    retryable = True


class ToolError(GatewayError):
    """A tool failed; the message becomes the tool's error result."""

    label = "tool_error"


class ToolForbidden(ToolError):
    """A tool refuses its caller (another user's order, say): the call fails with the code
    ``forbidden`` (``tool.status``), and the model sees the message."""

    label = "tool_forbidden"


class ConfigError(GatewayError):
    """The gateway's configuration (agent file, scenario, flags) is invalid."""

    label = "config_error"


class TooManySessions(GatewayError):
    """A new session would go over a session quota (nil while the gateway shuts down): the
    socket is refused, nothing ends.

    Args:
        reason: what the client is told, if not the usual reason of ``label``'s row.
        label: which quota: ``gateway_full``, ``too_many_sessions`` or ``shutting_down``.
    """

    retryable = True

    def __init__(self, reason: str | None = None, *, label: str) -> None:
        told = closing(label, reason).reason
        super().__init__(told, label=label)
        self.close_reason = told


class StoreUnavailable(GatewayError):
    """The session store (Redis) does not answer: the session cannot go on on this node now.

    The client should come back later (close 1013); nothing is lost that was committed. The
    message names the store, so a close tells the client only its row's reason.
    """

    label = "store_unavailable"
    retryable = True
