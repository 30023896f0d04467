"""What the client SDK raises."""

from __future__ import annotations

from gateway.errors import GatewayError
from gateway.wire.v1 import Error, SessionSnapshot

__all__ = ["ClientError", "ResumeGap", "ServerError", "SessionClosed"]


class ClientError(GatewayError):
    """Base of the SDK's exceptions."""


class ServerError(ClientError):
    """The gateway answered with an ``error`` event (``event.code`` says which)."""

    def __init__(self, event: Error) -> None:
        super().__init__(f"{event.code}: {event.message}")
        self.event = event
        self.code = event.code  # type: ignore[assignment]  # any wire code, not only ours
        self.retryable = event.retryable
        self.retry_after = event.retry_after
        """Seconds after which the same request may succeed (``rate_limited``,
        ``budget_exceeded``), if the gateway said."""


class SessionClosed(ClientError):
    """The session cannot go on (closed normally, expired, refused, taken over...)."""

    def __init__(self, closed_with: int, reason: str = "") -> None:
        super().__init__(f"session closed ({closed_with}{': ' + reason if reason else ''})")
        self.closed_with = closed_with
        """The WebSocket close code that ended it (docs/protocol.md lists them)."""
        self.reason = reason


class ResumeGap(ClientError):
    """After a reconnect the gateway no longer had every missed event; rebuild from
    ``snapshot`` (the transcript so far and the open calls)."""

    def __init__(self, snapshot: SessionSnapshot) -> None:
        super().__init__("events were lost across a reconnect; rebuild from the snapshot")
        self.snapshot = snapshot
