"""Where the session core puts what it wants done: numbered events and other effects."""

from __future__ import annotations

from gateway.core.event import Effect, Send
from gateway.core.outbound import Error, ServerMsg

__all__ = ["Outbox"]


class Outbox:
    """Numbers server events (``seq`` from 1) and collects effects in order."""

    def __init__(self) -> None:
        self.seq = 0
        self._effects: list[Effect] = []

    def send(self, msg: ServerMsg) -> None:
        """Queue ``msg`` for the client with the next ``seq``."""
        self.seq += 1
        msg.seq = self.seq
        self._effects.append(Send(msg))

    def error(
        self,
        code: str,
        message: str,
        *,
        in_reply_to: str | None = None,
        call_id: str | None = None,
        response_id: str | None = None,
        retryable: bool = False,
    ) -> None:
        """Queue an ``error`` event."""
        self.send(
            Error(
                code=code,
                message=message,
                in_reply_to=in_reply_to,
                call_id=call_id,
                response_id=response_id,
                retryable=retryable,
            )
        )

    def do(self, effect: Effect) -> None:
        """Queue an effect other than a send."""
        self._effects.append(effect)

    def take(self) -> list[Effect]:
        """Everything queued since the last call, in order."""
        effects, self._effects = self._effects, []
        return effects
