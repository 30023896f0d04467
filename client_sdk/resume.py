"""Resuming a conversation after its socket dropped: the reconnect loop and the outbox.

``Conversation`` (client.py) owns the session's events; this module owns what happens
between two sockets. ``Reconnector.run`` opens sockets with backoff and jitter until the
gateway answers a ``session.resume`` (or says the session is gone); ``Reconnector.dial``
opens one for a session not started yet (the first connect, or a drop before
``session.created``); either gives up after ``give_up_after`` seconds of failed attempts;
``Reconnector.end`` ends a session that has no socket (``close()`` mid-reconnect) with
``DELETE /v1/sessions/{id}``. A socket that resumes a session (``run``) is opened with its
id, which the caller puts
in the URL (``?session=``, for load balancers that route by session: see
``connection.resume_url``); one for a new session without.
``Outbox`` keeps what the client sent that the gateway has not confirmed, to be sent again
on the new socket
(the gateway applies each message once: results, ``tool.run`` and ``tool.confirmation`` by
call id, user messages and ``session.update`` by their id). The JS SDK
(js/resume.js) follows the same steps.
"""

from __future__ import annotations

import asyncio
import contextlib
import random
import time
from collections.abc import Awaitable, Callable
from typing import Literal, TypeVar
from urllib.parse import quote, urlsplit, urlunsplit

import httpx
import msgspec
import websockets
from websockets.asyncio.client import ClientConnection

from client_sdk.exceptions import SessionClosed
from client_sdk.framing import message_frame, read_frame
from gateway.errors import CloseCode
from gateway.wire.audio_frame import AnswerAudio
from gateway.wire.v1 import (
    ClientMsg,
    Error,
    Outbound,
    ResponseCreated,
    ResponseTruncate,
    ResponseTruncated,
    SessionCreated,
    SessionResume,
    SessionUpdate,
    SessionUpdated,
    ToolCalls,
    ToolConfirmation,
    ToolResult,
    ToolResults,
    ToolRun,
    ToolSpec,
    ToolStatus,
    UserMessage,
)

__all__ = [
    "ATTEMPT_TIMEOUT",
    "END_TIMEOUT",
    "FINAL_CLOSES",
    "GIVE_UP_AFTER",
    "MAX_RESULTS_PER_MESSAGE",
    "Outbox",
    "PendingRun",
    "Reconnector",
    "Resumed",
    "closed_with",
    "drop",
    "resume_of",
    "session_url",
]

ATTEMPT_TIMEOUT = 10.0
"""Seconds an attempt may take, from the dial to the gateway's answer to ``session.start``
or ``session.resume``, before its socket is dropped and it counts as failed (default of
the ``attempt_timeout`` option)."""
GIVE_UP_AFTER = 120.0
"""Seconds of failed attempts in a row after which the SDK gives up (default of the
``give_up_after`` option): the gateway's default ``session_ttl``, after which a resume
cannot succeed anyway."""
END_TIMEOUT = 0.8
"""Seconds ``close()`` spends ending a session that has no socket (``Reconnector.end``):
``close()`` returns within a second whatever the network does."""
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


T = TypeVar("T")
Retry = Literal["retry"]


def gave_up(after: float) -> SessionClosed:
    """What the app sees when the SDK stops trying to reach the gateway."""
    return SessionClosed(1006, f"could not reach the gateway for {after:g} s")


def refused_for_good(exc: BaseException) -> bool:
    """An upgrade the gateway refused with a status no retry changes (a bad key or token,
    a foreign origin, a wrong path), unlike 408, 429 and 5xx."""
    return (
        isinstance(exc, websockets.InvalidStatus)
        and 400 <= exc.response.status_code < 500
        and exc.response.status_code not in (408, 429)
    )


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
        self.sent: dict[str, UserMessage | SessionUpdate | ResponseTruncate] = {}
        """In the order sent, by id: user messages until a response to them starts,
        ``session.update`` messages until ``session.updated`` answers them, and
        ``response.truncate`` until ``response.truncated`` does (or, any, until an error
        does)."""

    def keep(self, msg: UserMessage | SessionUpdate | ResponseTruncate) -> None:
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
            case SessionUpdated(in_reply_to=msg_id) | ResponseTruncated(in_reply_to=msg_id) if (
                msg_id
            ):
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
    """Gets a session a socket: a new one after a drop, or the first one.

    Args:
        open_socket: opens a socket to the gateway (credentials included): to resume the
            session whose id it is given, or for a new session when given ``None``.
        max_delay: the longest wait between attempts, in seconds.
        attempt_timeout: seconds an attempt may take, from the dial to the answer.
        give_up_after: seconds of failed attempts in a row after which it gives up.
    """

    def __init__(
        self,
        open_socket: Callable[[str | None], Awaitable[ClientConnection]],
        max_delay: float,
        *,
        attempt_timeout: float = ATTEMPT_TIMEOUT,
        give_up_after: float = GIVE_UP_AFTER,
    ) -> None:
        self._open_socket = open_socket
        self._max_delay = max_delay
        self.attempt_timeout = attempt_timeout
        self._give_up_after = give_up_after
        self._pending: ClientConnection | None = None
        """A socket resuming the session, until the gateway answers (``stop()`` drops it)."""
        self._stopped = False
        self._wake: asyncio.Event | None = None
        """Set by ``retry_now()`` to end the wait between two attempts now under way."""

    def stop(self) -> None:
        """No more attempts; drop the socket of one in progress.

        That socket is not the session's yet, and a gateway that does not answer would not
        answer a close either.
        """
        self._stopped = True
        drop(self._pending)

    def retry_now(self) -> bool:
        """Cut the wait between two attempts short: the next attempt starts at once. The
        wait after it, should it fail too, is as long as it would have been (the backoff
        keeps growing), and the give-up count goes on from the first failure.

        Returns:
            ``True`` when a wait was cut short; ``False`` when none was under way (connected,
            stopped, an attempt in flight, nothing started yet).
        """
        wake = self._wake
        if wake is None or wake.is_set() or self._stopped:
            return False
        wake.set()  # the loop of _retry goes on with its next attempt: no second loop
        return True

    async def run(self, resume: SessionResume) -> Resumed | SessionClosed | None:
        """Send ``resume`` on new sockets with backoff and jitter until the gateway answers.

        Returns:
            The new socket and the answer; ``SessionClosed`` when the gateway closed the
            attempt with a final code (the session is lost); ``None`` after ``stop()``.
        """
        return await self._retry(lambda: self._attempt(resume))

    async def ahead(self, resume: SessionResume, within: float) -> Resumed | None:
        """Resume on a new socket while the session's socket still works
        (``session.going_away``): attempts with backoff for up to ``within`` seconds (at
        least one; a node that is going away refuses new sockets, and a load balancer may
        send one there). The new socket and the answer, or ``None`` whatever went wrong:
        the session's socket is kept, and resumed as usual once it closes."""
        deadline = time.monotonic() + within
        delay = FIRST_DELAY
        while not self._stopped:
            outcome = await self._attempt(resume)
            if isinstance(outcome, Resumed):
                return outcome
            pause = delay * random.uniform(0.5, 1.0)
            if time.monotonic() + pause >= deadline:
                break
            await self._pause(pause)
            delay = min(delay * 2, self._max_delay)
        return None

    async def dial(self, *, first: bool = False) -> ClientConnection | SessionClosed | None:
        """Open a socket for a session not started yet, with backoff and jitter.

        Args:
            first: the conversation's first socket: an upgrade refused for good (HTTP 401,
                403...) raises at once, as no retry changes it.

        Returns:
            The socket; ``SessionClosed`` after ``give_up_after``; ``None`` after ``stop()``.
        """
        return await self._retry(lambda: self._open(first=first))

    async def end(self, session: SessionCreated, url: str) -> bool:
        """End ``session``, which has no socket, with ``DELETE /v1/sessions/{id}`` to the
        gateway of ``url`` (its resume token as the credential), within ``END_TIMEOUT``.

        A socket would need an upgrade and a resume before its close, on a network slow
        enough to have held the resume: one HTTP request is all it takes. Should it not be
        answered in time, it is abandoned, and the gateway ends the session after its
        ``session_ttl``.

        Returns:
            ``True`` when the gateway said the session is over (204; 404: it has no such
            session, or not for this token); ``False`` when it did not answer in time, or
            answered otherwise.
        """
        with contextlib.suppress(Exception):
            async with (
                asyncio.timeout(END_TIMEOUT),
                httpx.AsyncClient(timeout=END_TIMEOUT) as client,
            ):
                response = await client.delete(
                    session_url(url, session.session_id),
                    headers={"Authorization": f"Bearer {session.resume_token}"},
                )
                return response.status_code in (204, 404)
        return False

    async def _retry(
        self, attempt: Callable[[], Awaitable[T | SessionClosed | Retry]]
    ) -> T | SessionClosed | None:
        """Make ``attempt`` until it is not ``retry``, with backoff and jitter, giving up
        after ``give_up_after`` seconds of failures; ``None`` after ``stop()``."""
        delay = FIRST_DELAY
        first_failure: float | None = None
        while not self._stopped:
            outcome = await attempt()
            if outcome != "retry":
                return outcome  # not "retry": T or SessionClosed
            now = time.monotonic()
            first_failure = now if first_failure is None else first_failure
            if now - first_failure >= self._give_up_after:
                return gave_up(self._give_up_after)
            if self._stopped:
                break
            await self._pause(delay * random.uniform(0.5, 1.0))  # jitter: no thundering herd
            delay = min(delay * 2, self._max_delay)
        return None

    async def _pause(self, seconds: float) -> None:
        """Wait ``seconds`` between two attempts, or less when ``retry_now()`` cuts it short."""
        wake = self._wake = asyncio.Event()
        try:
            with contextlib.suppress(TimeoutError):
                async with asyncio.timeout(seconds):
                    await wake.wait()
        finally:
            self._wake = None

    async def _open(self, *, first: bool) -> ClientConnection | Retry:
        """One attempt at a socket (within ``attempt_timeout``)."""
        try:
            async with asyncio.timeout(self.attempt_timeout):
                websocket = await self._open_socket(None)
        except (OSError, TimeoutError, websockets.InvalidHandshake) as exc:
            if first and refused_for_good(exc):
                raise
            return "retry"
        if self._stopped:  # close() came meanwhile
            drop(websocket)
            return "retry"
        return websocket

    async def _attempt(self, resume: SessionResume) -> Resumed | SessionClosed | Retry:
        """One attempt: open a socket, send ``session.resume``, wait for the answer, all
        within ``attempt_timeout``."""
        websocket: ClientConnection | None = None
        try:
            async with asyncio.timeout(self.attempt_timeout):
                websocket = self._pending = await self._open_socket(resume.session_id)
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


def session_url(url: str, session_id: str) -> str:
    """The HTTP URL of the session ``session_id`` on the gateway whose realtime socket is at
    ``url``: ``wss://host/prefix/v1/realtime?...`` gives ``https://host/prefix/v1/sessions/<id>``
    (the query, which may hold a token, is left out: the resume token goes in a header)."""
    parts = urlsplit(url)
    scheme = {"ws": "http", "wss": "https"}.get(parts.scheme, parts.scheme)
    base = parts.path.rsplit("/", 1)[0]  # what holds "realtime": "/v1" by default
    path = f"{base}/sessions/{quote(session_id, safe='')}"
    return urlunsplit((scheme, parts.netloc, path, "", ""))


def resume_of(
    session: SessionCreated,
    last_seq: int,
    device_id: str | None = None,
    functions: list[ToolSpec] | None = None,
) -> SessionResume:
    """The ``session.resume`` of ``session`` from ``last_seq``; with ``device_id``, as that
    device (the others sharing the session stay attached), declaring ``functions``."""
    return SessionResume(
        session_id=session.session_id,
        resume_token=session.resume_token,
        last_seq=last_seq,
        device_id=device_id,
        client_functions=functions if device_id is not None else None,
    )


async def _handshake(websocket: ClientConnection, resume: SessionResume) -> Resumed:
    """Send ``session.resume``; return the answer (and the snapshot after a gap)."""
    await websocket.send(message_frame(websocket, resume))
    answer = await _answer(websocket)
    if isinstance(answer, Error) and answer.code == "resume_gap":
        return Resumed(websocket, answer, await _answer(websocket))
    return Resumed(websocket, answer)


async def _answer(websocket: ClientConnection) -> Outbound:
    """The gateway's next event (its framing's), skipping audio; an event this SDK cannot
    read is refused as a JSON event would be."""
    while True:
        frame = await websocket.recv()
        event = read_frame(websocket, frame)
        if event is None:
            raise msgspec.ValidationError(f"an event this SDK cannot read: {frame[:64]!r}")
        if not isinstance(event, AnswerAudio):
            return event


def drop(websocket: ClientConnection | None) -> None:
    """Drop a socket that never became the session's: left open, its gateway node would
    keep the session attached to a socket nobody reads. Dropped, not closed: a normal
    close (1000) would end the session."""
    if websocket is not None:
        websocket.transport.abort()
