"""Resuming a conversation after its socket dropped: the reconnect loop and the outbox.

``Conversation`` (client.py) owns the session's events; this module owns what happens
between two sockets. ``Reconnector.run`` opens sockets with backoff and jitter until the
gateway answers a ``session.resume`` (or says the session is gone); ``Outbox`` keeps what
the client sent that the gateway has not confirmed, to be sent again on the new socket
(the gateway applies each message once: results, ``tool.run`` and ``tool.confirmation`` by
call id, user messages and ``session.update`` by their id). The JS SDK
(js/gateway-client.js) follows the same steps.
"""

from __future__ import annotations

import asyncio
import random
from collections.abc import Awaitable, Callable
from typing import Literal

import msgspec
import websockets
from websockets.asyncio.client import ClientConnection

from client_sdk.exceptions import SessionClosed
from gateway.errors import CloseCode
from gateway.protocol import (
    ClientMsg,
    Error,
    Outbound,
    ResponseCreated,
    SessionCreated,
    SessionResume,
    SessionUpdate,
    SessionUpdated,
    ToolCalls,
    ToolConfirmation,
    ToolResult,
    ToolResults,
    ToolRun,
    ToolStatus,
    UserMessage,
    decode_server,
    encode,
)

__all__ = [
    "FINAL_CLOSES",
    "MAX_RESULTS_PER_MESSAGE",
    "RESUME_ANSWER_TIMEOUT",
    "Outbox",
    "PendingRun",
    "Reconnector",
    "Resumed",
    "closed_with",
    "drop",
]

RESUME_ANSWER_TIMEOUT = 10.0
"""Seconds a resume waits for the gateway's answer before it drops that socket and retries."""
MAX_RESULTS_PER_MESSAGE = 128
"""Results resent after a resume go in ``tool.results`` messages of at most this many (the
protocol's limit per message)."""
FIRST_DELAY = 0.05
"""Seconds before the second attempt; each further one waits twice as long (with jitter)."""
FINAL_CLOSES = frozenset(
    {
        CloseCode.NORMAL,
        CloseCode.POLICY,
        CloseCode.UNAUTHORIZED,
        CloseCode.FORBIDDEN_ORIGIN,
        CloseCode.UNKNOWN_SESSION,
        CloseCode.SESSION_EXPIRED,
        CloseCode.TAKEN_OVER,
    }
)
"""Closes after which resuming makes no sense: the session is gone or not ours. Any other
(1006, 1007, 1009, 1011, 1012, 1013...) is resumed."""


def closed_with(exc: websockets.ConnectionClosed) -> SessionClosed:
    """The close code and reason of ``exc`` (1006 when no close frame came)."""
    if exc.rcvd is None:
        return SessionClosed(1006)
    return SessionClosed(exc.rcvd.code, exc.rcvd.reason)


class PendingRun(msgspec.Struct, frozen=True):
    """A ``tool.run`` the gateway has not confirmed, and the tool of its call."""

    msg: ToolRun
    tool: str


class Outbox:
    """What the client sent that the gateway has not confirmed yet."""

    def __init__(self) -> None:
        self.results: dict[str, ToolResult] = {}
        """Client-function results until a ``tool.status`` for their call."""
        self.runs: dict[str, PendingRun] = {}
        """``tool.run`` requests by call id, until a ``tool.status`` for their call, or an
        error that answers them and is not retryable."""
        self.confirmations: dict[str, ToolConfirmation] = {}
        """``tool.confirmation`` answers by call id, until a ``tool.status`` for their call
        (a server tool's, or a declined call's), a ``tool.calls`` that holds it (an approved
        client function's), or an error that answers them and is not retryable."""
        self.sent: dict[str, UserMessage | SessionUpdate] = {}
        """In the order sent, by id: user messages until a response to them starts, and
        ``session.update`` messages until ``session.updated`` answers them (or, either, until
        an error does)."""

    def keep(self, msg: UserMessage | SessionUpdate) -> None:
        """Keep ``msg`` (it has an id) until the gateway confirms it.

        A ``session.update`` replaces the unanswered ones sent just before it (no user
        message in between) that it overrides in full: every field they set, it sets too.
        """
        if msg.id is None:
            raise ValueError("only a message with an id can wait for confirmation")
        if isinstance(msg, SessionUpdate):
            fields = _fields_set(msg)
            for msg_id, earlier in reversed(list(self.sent.items())):
                if not isinstance(earlier, SessionUpdate):
                    break  # a user message between them is answered with the earlier settings
                if _fields_set(earlier) <= fields:
                    del self.sent[msg_id]
        self.sent[msg.id] = msg

    def keep_run(self, run: ToolRun, tool: str) -> None:
        """Keep ``run`` (it has an id) until the gateway confirms it."""
        if run.id is None:
            raise ValueError("only a message with an id can wait for confirmation")
        self.runs[run.call_id] = PendingRun(run, tool)

    def keep_confirmation(self, answer: ToolConfirmation) -> None:
        """Keep ``answer`` (it has an id) until the gateway confirms it."""
        if answer.id is None:
            raise ValueError("only a message with an id can wait for confirmation")
        self.confirmations[answer.call_id] = answer

    def refused_confirmation(self, event: Error) -> ToolConfirmation | None:
        """The ``tool.confirmation`` that ``event`` refuses for good (not ``retryable``)."""
        if event.in_reply_to is None or event.retryable:
            return None
        for answer in self.confirmations.values():
            if answer.id == event.in_reply_to:
                return answer
        return None

    def refused_run(self, event: Error) -> PendingRun | None:
        """The ``tool.run`` that ``event`` refuses for good (not ``retryable``), if any."""
        if event.in_reply_to is None or event.retryable:
            return None
        for pending in self.runs.values():
            if pending.msg.id == event.in_reply_to:
                return pending
        return None

    def confirm(self, event: Outbound) -> None:
        """Forget what ``event`` shows the gateway has applied."""
        match event:
            case ToolStatus(call_id=call_id):
                self.results.pop(call_id, None)
                self.runs.pop(call_id, None)
                self.confirmations.pop(call_id, None)
            case ToolCalls(calls=calls):
                for call in calls:  # an approved client function's call: the answer arrived
                    self.confirmations.pop(call.call_id, None)
            case ResponseCreated(in_reply_to=msg_id) if msg_id:
                self.sent.pop(msg_id, None)
            case SessionUpdated(in_reply_to=msg_id) if msg_id:
                self.sent.pop(msg_id, None)
            case Error(in_reply_to=msg_id) if msg_id:
                self.sent.pop(msg_id, None)
                if (refused := self.refused_run(event)) is not None:
                    del self.runs[refused.msg.call_id]
                if (answer := self.refused_confirmation(event)) is not None:
                    del self.confirmations[answer.call_id]

    def resend(self) -> list[ClientMsg]:
        """Everything unconfirmed, in the order to send it on a resumed socket: results,
        ``tool.run`` requests, ``tool.confirmation`` answers, then user messages and
        ``session.update`` in the order sent."""
        results = list(self.results.values())
        batches: list[ClientMsg] = [
            ToolResults(results=results[at : at + MAX_RESULTS_PER_MESSAGE])
            for at in range(0, len(results), MAX_RESULTS_PER_MESSAGE)
        ]
        runs = [pending.msg for pending in self.runs.values()]
        return [*batches, *runs, *self.confirmations.values(), *self.sent.values()]


def _fields_set(update: SessionUpdate) -> set[str]:
    """The fields a ``session.update`` changes (those it does not leave ``None``)."""
    return {f for f in update.__struct_fields__ if f != "id" and getattr(update, f) is not None}


class Resumed(msgspec.Struct, frozen=True):
    """A socket the session is on again, and the gateway's answer to the resume."""

    websocket: ClientConnection
    answer: Outbound
    """``session.resumed``; the ``resume_gap`` error after a gap; rarely, an event that
    overtook the answer (the caller handles it like any other)."""
    snapshot: Outbound | None = None
    """After ``resume_gap``: the ``session.snapshot`` to rebuild from."""


class Reconnector:
    """Gets a dropped session a new socket.

    Args:
        open_socket: opens a socket to the gateway (credentials included).
        max_delay: the longest wait between attempts, in seconds.
    """

    def __init__(
        self, open_socket: Callable[[], Awaitable[ClientConnection]], max_delay: float
    ) -> None:
        self._open_socket = open_socket
        self._max_delay = max_delay
        self._pending: ClientConnection | None = None
        """A socket resuming the session, until the gateway answers (``stop()`` drops it)."""
        self._stopped = False

    def stop(self) -> None:
        """No more attempts; drop the socket of one in progress.

        That socket is not the session's yet, and a gateway that does not answer would not
        answer a close either.
        """
        self._stopped = True
        drop(self._pending)

    async def run(self, session: SessionCreated, last_seq: int) -> Resumed | SessionClosed | None:
        """Resume ``session`` from ``last_seq`` with backoff and jitter until the gateway answers.

        Returns:
            The new socket and the answer; ``SessionClosed`` when the gateway closed the
            attempt with a final code (the session is lost); ``None`` after ``stop()``.
        """
        resume = SessionResume(
            session_id=session.session_id, resume_token=session.resume_token, last_seq=last_seq
        )
        delay = FIRST_DELAY
        while not self._stopped:
            outcome = await self._attempt(resume)
            if outcome != "retry":
                return outcome
            await asyncio.sleep(delay * random.uniform(0.5, 1.0))  # jitter: no thundering herd
            delay = min(delay * 2, self._max_delay)
        return None

    async def _attempt(self, resume: SessionResume) -> Resumed | SessionClosed | Literal["retry"]:
        """One attempt: open a socket, send ``session.resume``, wait for the answer."""
        websocket: ClientConnection | None = None
        try:
            websocket = self._pending = await self._open_socket()
            resumed = await _handshake(websocket, resume)
        except websockets.ConnectionClosed as exc:
            closed = closed_with(exc)
            return closed if closed.closed_with in FINAL_CLOSES else "retry"
        except (OSError, TimeoutError, websockets.InvalidHandshake, msgspec.DecodeError):
            drop(websocket)  # the gateway is not reachable, or not answering, yet
            return "retry"
        except BaseException:
            drop(websocket)  # cancelled (close()) mid-resume: never leave the socket open
            raise
        finally:
            self._pending = None
        if self._stopped:  # close() came while the answer was on its way
            drop(websocket)
            return "retry"
        return resumed


async def _handshake(websocket: ClientConnection, resume: SessionResume) -> Resumed:
    """Send ``session.resume``; return the answer (and the snapshot after a gap)."""
    await websocket.send(encode(resume).decode())
    async with asyncio.timeout(RESUME_ANSWER_TIMEOUT):
        answer = decode_server(await websocket.recv())
        if isinstance(answer, Error) and answer.code == "resume_gap":
            return Resumed(websocket, answer, decode_server(await websocket.recv()))
        return Resumed(websocket, answer)


def drop(websocket: ClientConnection | None) -> None:
    """Drop a socket that never became the session's: left open, its gateway node would
    keep the session attached to a socket nobody reads. Dropped, not closed: a normal
    close (1000) would end the session."""
    if websocket is not None:
        websocket.transport.abort()
