"""Which user messages a session takes, and why it refuses the others.

Part of the pure session core: no I/O. A user message is taken once per id: a client
that is not sure its message arrived before a drop sends it again, and it counts once
(the ids of the last ``REMEMBERED_MESSAGE_IDS`` messages taken are kept, in the session's
state). Only taken messages are remembered, so one refused as busy may be sent again as
it is. A message is refused, with an ``error`` saying why, when its text is over
``max_message_chars`` or blank, when it asks for a ``tool_choice``, ``max_steps`` or tools
the session cannot honour, or when ``max_queued_messages`` already wait for the running
response.
"""

from __future__ import annotations

from gateway.core.dispatch import Dispatcher
from gateway.core.inbound import UserMessage
from gateway.core.outbox import Outbox
from gateway.core.state import SessionState
from gateway.core.terms import Terms

__all__ = ["REMEMBERED_MESSAGE_IDS", "Intake"]

REMEMBERED_MESSAGE_IDS = 1_000
"""Ids of the latest user messages taken that a session keeps (a repeated id counts once)."""


class Intake:
    """The user messages one session takes; see the module docstring.

    Args:
        state: the session's state (the response running, the queue, the ids taken).
        terms: what the session runs under (the limits, what it can honour).
        calls: the dispatcher, whose tools a message may narrow.
        outbox: where refusals go, as ``error`` events.
    """

    __slots__ = (
        "_calls",
        "_out",
        "_state",
        "_taken",
        "_terms",
    )  # one of each per session: no __dict__ each

    def __init__(
        self, state: SessionState, *, terms: Terms, calls: Dispatcher, outbox: Outbox
    ) -> None:
        self._state = state
        self._terms = terms
        self._calls = calls
        self._out = outbox
        self._taken = dict.fromkeys(state.message_ids)
        """``state.message_ids`` for lookups: asked of every user message with an id (a dict:
        an empty one is 64 bytes, an empty set 216, and every session holds one)."""

    def admit(self, msg: UserMessage) -> bool:
        """Whether the session takes ``msg`` (to answer now, or once the running response
        is done); ``False`` for an id taken already (nothing is sent) and after an
        ``error``."""
        state = self._state
        limits = self._terms.settings.limits
        if msg.id is not None and msg.id in self._taken:
            return False
        if len(msg.text) > limits.max_message_chars:
            self._out.error(
                "message_too_large",
                f"text has {len(msg.text)} characters; the limit is {limits.max_message_chars}",
                in_reply_to=msg.id,
            )
        elif not msg.text.strip():
            self._out.error("invalid_message", "text must not be blank", in_reply_to=msg.id)
        elif not self._terms.choice_fits(
            self._calls.tools, msg.tool_choice, msg.max_steps, msg.tools, msg.id
        ):
            pass  # the error is sent
        elif state.response is not None and len(state.queue) >= limits.max_queued_messages:
            self._out.error(
                "busy",
                "too many messages waiting for the running response",
                in_reply_to=msg.id,
                retryable=True,
            )
        else:
            self._remember(msg.id)
            return True
        return False

    def _remember(self, msg_id: str | None) -> None:
        if msg_id is None:
            return
        ids = self._state.message_ids
        ids.append(msg_id)
        self._taken[msg_id] = None
        while len(ids) > REMEMBERED_MESSAGE_IDS:
            self._taken.pop(ids.pop(0), None)
