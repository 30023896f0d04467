"""Why the gateway closes a socket: one table, for every endpoint and wire protocol.

Each way a socket can end has a label, the same as in logs and metrics
(``connection_refused label=...``). ``closing(label)`` gives its close code and the reason
sent with it, so every module, and every codec (v1 and the OpenAI-compatible one), closes
the same way for the same cause. A refusal caused by an error takes the error's own close
code (``GatewayError.close_code``) and message: ``of_error``. The close-code table in
docs/protocol.md documents these rows.
"""

from __future__ import annotations

from typing import NamedTuple

from gateway.errors import CloseCode, GatewayError

__all__ = ["Closing", "closing", "of_error"]


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
