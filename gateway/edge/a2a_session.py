"""A2A contexts as gateway sessions: a conversation driven in process, one task at a time.

Each A2A ``context_id`` is one gateway session of the caller's principal, opened and driven
as a socket endpoint does (``gateway.edge.handshake.open_session``, ``Driver.attach``), its
socket an in-process one: the session's v1 events are decoded as they are written, and read
by the task's ``Turn`` (``gateway.edge.a2a_turn``). While a task runs the socket is
attached; once it ends the socket goes, and the session waits ``session_ttl`` for the
context's next message, which attaches a new one (a resume, from the last event seen).

The session has no app: a call of a client function the model makes is answered at once
with an error the model reads, and a call that needs the user's approval is declined.

A context goes on on whichever node its message lands. Its session is saved in the store
as a named value, ``a2a:context:<context_id>`` (``ContextRecord``: its principal, the
session's id and resume token, the last event seen), when the session is opened and when
each task ends (before the caller is told it ended, so that a next message sent at once
to another node finds it). A node that does not know the context reads it there and
resumes the session, taking it over from the node that ran the last task, as a v1 resume
does. The record is the context's only: another principal naming the context is refused.
A context whose session has ended (idle past ``session_ttl``, ended by the agent) starts a
new one, without the earlier history.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable

import msgspec
import structlog

from gateway.core.principal import Principal
from gateway.edge.a2a_turn import Output, Status, Turn
from gateway.edge.handshake import open_session
from gateway.errors import StoreUnavailable
from gateway.shell.connection import BinaryFrame, Connection
from gateway.shell.driver import Driver
from gateway.shell.runtime import Runtime
from gateway.wire.v1 import (
    Inbound,
    ResponseCancel,
    SessionCreated,
    SessionResume,
    SessionStart,
    ToolCalls,
    ToolConfirm,
    ToolConfirmation,
    ToolResult,
    ToolResults,
    UserMessage,
    decode_server,
)

__all__ = ["NO_APP", "ContextRecord", "Conversation", "Conversations", "Refused", "context_name"]

log = structlog.get_logger("gateway.a2a")

NO_APP = "runs in the user's app; no app in this A2A conversation"
"""The error a client-function call gets in an A2A session (the model reads it)."""
_NO_USER = "no user takes part in this A2A conversation to approve it"
"""Why a call that needs the user's approval is declined in an A2A session."""
_RECORD_MARGIN = 60.0
"""Seconds a context's record outlives its session's keys (``session_ttl`` plus
``lease_ttl`` after the last task): a message just after the session expired still finds
whose the context was, and is told its session ended."""


class ContextRecord(msgspec.Struct, frozen=True):
    """What a node needs to go on with an A2A context another node served."""

    principal: str
    """Whose context it is (``Principal.name``): only they may send to it."""
    session_id: str
    resume_token: str
    last_seq: int
    """The newest event of the session the context has seen: a resume replays the rest."""


_encode_record = msgspec.msgpack.Encoder().encode
_decode_record = msgspec.msgpack.Decoder(ContextRecord).decode


def context_name(context_id: str) -> str:
    """The store's name of a context's record (``Store.put_named``)."""
    return f"a2a:context:{context_id}"


class Refused(Exception):
    """The conversation cannot take the message; ``reason`` says why."""

    def __init__(self, reason: str) -> None:
        super().__init__(reason)
        self.reason = reason


class _LocalSocket:
    """A socket that never leaves the process: what the session writes is handed to
    ``received`` as it is written (a ``Socket`` and a ``FrameWriter`` for ``Connection``),
    and its close to ``closed``."""

    def __init__(
        self,
        received: Callable[[list[bytes]], None],
        closed: Callable[[_LocalSocket, int, str], None],
    ) -> None:
        self._received = received
        self._closed = closed

    async def send_text(self, data: str) -> None:
        self._received([data.encode()])

    async def send_bytes(self, data: bytes) -> None:
        """The answer's audio: a text conversation has none."""

    async def close(self, code: int = 1000, reason: str | None = None) -> None:
        self._closed(self, code, reason or "")

    def write_now(self, frames: list[bytes]) -> bool:
        self._received(frames)
        return True

    async def write(self, frames: list[bytes]) -> None:
        self._received(frames)


class Conversation:
    """One A2A context: the session it is, and the task running in it (at most one).

    Args:
        runtime: the gateway's runtime.
        context_id: the A2A context.
        principal: who the context belongs to (the caller's API key or token).
        forget: called once the session has ended: the context is forgotten.
    """

    def __init__(
        self,
        runtime: Runtime,
        context_id: str,
        principal: Principal,
        forget: Callable[[Conversation], None],
    ) -> None:
        self.context_id = context_id
        self.principal = principal
        self.session_id: str | None = None
        self.turn: Turn | None = None
        self._runtime = runtime
        self._forget = forget
        self._resume_token = ""
        self._last_seq = 0
        """The newest event seen: a resume replays only what came after it."""
        self._driver: Driver | None = None
        self._conn: Connection | None = None
        self._socket: _LocalSocket | None = None
        """The socket of ``_conn``, the one whose close matters."""
        self._watched: Driver | None = None
        """The driver whose end makes the context forgotten."""
        self._outputs: asyncio.Queue[Output] = asyncio.Queue()
        self._settling = False
        self._closed_reason = ""
        self._created = asyncio.Event()
        """Set at the new session's ``session.created`` (or its socket's close)."""

    @property
    def busy(self) -> bool:
        """A task runs in the conversation."""
        return self.turn is not None

    async def begin(self, task_id: str, text: str, tool_choice: str | None = None) -> None:
        """Start the task ``task_id``: attach to the session (open it first for a new
        context) and send ``text`` as the user's message; then read ``next_output``.

        Raises:
            Refused: the conversation has a task running, or no session could be opened
                (a session quota, a shutdown...); the reason says which.
        """
        if self.turn is not None:
            raise Refused(
                f"the conversation is busy with task {self.turn.message_id}: wait for it to"
                " end, or cancel it"
            )
        turn = self.turn = Turn(task_id)
        self._outputs = asyncio.Queue()
        try:
            await self._attach()
        except BaseException:
            self.turn = None
            if self.session_id is None:  # never opened: nothing to come back to
                self._forget(self)
            raise
        self._send(UserMessage(text=text, id=task_id, tool_choice=tool_choice))
        log.info("a2a_task_started", task_id=task_id, chars=len(text), skill_tool=tool_choice)
        if turn.ended:  # the socket closed meanwhile
            self._flush()

    async def next_output(self) -> Output:
        """What the running task should say next; its ``End`` comes last."""
        return await self._outputs.get()

    def ready_outputs(self) -> list[Output]:
        """What the running task should say next, without waiting (maybe nothing)."""
        ready: list[Output] = []
        while not self._outputs.empty():
            ready.append(self._outputs.get_nowait())
        return ready

    def cancel(self, task_id: str) -> None:
        """Cancel the task's running response (``response.cancel``), if it has one. The
        task says nothing more: its caller is told it is cancelled."""
        turn = self.turn
        if turn is None or turn.message_id != task_id:
            return
        turn.ended = True
        if turn.response_id is not None:
            self._send(ResponseCancel(response_id=turn.response_id))

    def finish(self) -> None:
        """The task is over: let go of the session's socket (the session waits
        ``session_ttl`` for the context's next message); then ``save``."""
        self.turn = None
        conn, driver = self._conn, self._driver
        self._conn = self._driver = self._socket = None
        if conn is not None and driver is not None:
            driver.detach(conn)
            conn.close(1000)

    async def save(self) -> None:
        """Save where the context is (its session, the last event seen) in the store, for
        any node its next message lands on. A store that does not answer is logged, not
        raised (the task goes on, or has ended, either way): a node that then reads an older
        record resumes from an earlier event (the session replays what came after)."""
        if self.session_id is None:
            return
        record = ContextRecord(
            principal=self.principal.name,
            session_id=self.session_id,
            resume_token=self._resume_token,
            last_seq=self._last_seq,
        )
        config = self._runtime.config
        ttl = config.session_ttl + config.lease_ttl + _RECORD_MARGIN
        try:
            await self._runtime.store.put_named(
                context_name(self.context_id), _encode_record(record), ttl=ttl
            )
        except StoreUnavailable as exc:
            log.warning("a2a_context_unsaved", context_id=self.context_id, error=str(exc))

    def carry_on(self, record: ContextRecord) -> None:
        """Go on from ``record`` (saved by this node or another) if it is further on than
        what this node saw of the context: its next task resumes that session."""
        if self.turn is not None:
            return  # a task runs here: the record is this one's past
        if record.session_id == self.session_id and record.last_seq <= self._last_seq:
            return
        self.session_id = record.session_id
        self._resume_token = record.resume_token
        self._last_seq = record.last_seq

    # ----------------------------------------------------------------- the session

    async def _attach(self) -> None:
        """Give the session a socket: a new session, or the context's again."""
        if self._conn is not None:
            return
        conn = self._connection()
        self._closed_reason = ""
        if self.session_id is not None:
            if await self._resume(conn):
                return
            self.session_id = None
            self._last_seq = 0
            self._outputs.put_nowait(
                Status("a new conversation: the earlier session of this context has ended")
            )
            conn = self._connection()
        self._created = asyncio.Event()
        driver = await open_session(self._runtime, conn, self.principal, SessionStart())
        if driver is None:
            await conn.done.wait()  # refused: the close, with its reason, is under way
            raise Refused(self._closed_reason or "the gateway could not open a session")
        self._driver, self._conn = driver, conn
        self._watch(driver)
        # session.created carries the resume token; it is sent once the session's first
        # commit is durable (on Redis, after this): saved with it, any node finds the session.
        await self._created.wait()
        if self.session_id is None:
            raise Refused(self._closed_reason or "the conversation's session closed")
        log.info("a2a_context_opened", context_id=self.context_id, session_id=driver.session_id)
        await self.save()

    def _connection(self) -> Connection:
        """A new in-process socket, with the gateway's outbound bounds. Written at once,
        in the session's own round: its frames are read with no task in between."""
        socket = self._socket = _LocalSocket(self._received, self._closed)
        return self._runtime.connection(socket, frame_writer=socket)

    async def _resume(self, conn: Connection) -> bool:
        """Attach ``conn`` to the context's session, if it still lives.

        Raises:
            Refused: the session store does not answer.
        """
        assert self.session_id is not None
        resume = SessionResume(
            session_id=self.session_id, resume_token=self._resume_token, last_seq=self._last_seq
        )
        try:
            found = await self._runtime.find_session(resume, self.principal.name)
        except StoreUnavailable as exc:
            raise Refused(f"the conversation cannot be reached now: {exc}") from exc
        if not isinstance(found, Driver) or not await found.attach(conn, self._last_seq):
            return False
        self._driver, self._conn = found, conn
        self._watch(found)
        return True

    def _watch(self, driver: Driver) -> None:
        """Forget the context once ``driver``'s session ends (a session taken over from
        another node has a new driver: watched too)."""
        if driver is not self._watched:
            self._watched = driver
            driver.add_observer(_EndWatcher(lambda: self._forget(self)))

    def _send(self, msg: Inbound) -> None:
        if self._driver is not None and self._conn is not None:
            self._driver.feed_client(msg, self._conn)

    def _received(self, frames: list[bytes]) -> None:
        """Frames the session wrote: each read by the task's turn, in order."""
        for data in frames:
            if type(data) is BinaryFrame:
                continue
            try:
                msg = decode_server(data)
            except msgspec.DecodeError:  # ours, so never; logged if it were
                log.exception("a2a_event_unreadable")
                continue
            if msg.seq:
                if msg.seq <= self._last_seq:
                    continue  # replayed on a resume: seen already
                self._last_seq = msg.seq
            match msg:
                case SessionCreated(session_id=session_id, resume_token=token):
                    self.session_id, self._resume_token = session_id, token
                    self._created.set()
                case ToolCalls(calls=calls):
                    self._send(
                        ToolResults(
                            results=[
                                ToolResult(call_id=c.call_id, tool=c.tool, error=NO_APP)
                                for c in calls
                            ]
                        )
                    )
                case ToolConfirm(calls=asked):
                    for item in asked:
                        self._send(
                            ToolConfirmation(call_id=item.call_id, approved=False, reason=_NO_USER)
                        )
                case _:
                    pass
            if self.turn is not None:
                self.turn.feed(msg)
        self._flush()
        if not self._settling:  # once the batch written with these is read too
            self._settling = True
            asyncio.get_running_loop().call_soon(self._settle)

    def _settle(self) -> None:
        self._settling = False
        if self.turn is not None:
            self.turn.settle()
            self._flush()

    def _flush(self) -> None:
        if self.turn is not None:
            for output in self.turn.take():
                self._outputs.put_nowait(output)

    def _closed(self, socket: _LocalSocket, code: int, reason: str) -> None:
        """A socket closed: by ``finish``, or by the session (it ended, a shutdown, a
        refusal). One ``finish`` let go of closes after the next task took a new one."""
        if socket is not self._socket:
            return
        self._closed_reason = reason or f"the conversation's session closed ({code})"
        self._conn = self._driver = None
        self._created.set()  # no session.created to wait for any more
        if self.turn is not None:
            self.turn.gone(self._closed_reason)
            self._flush()


class _EndWatcher:
    """A session observer that calls ``ended`` once the session is over."""

    def __init__(self, ended: Callable[[], None]) -> None:
        self._ended = ended

    def started(self, now: float) -> None:
        pass

    def sent(self, msg: object, now: float) -> None:
        pass

    def attached(self, *, resumed: bool, replaced: bool, now: float) -> None:
        pass

    def detached(self, *, ended: bool, now: float) -> None:
        pass

    def ended(self, now: float) -> None:
        self._ended()


class Conversations:
    """This node's A2A contexts, by ``context_id``, each forgotten when its session ends;
    the others found through the store (``ContextRecord``)."""

    def __init__(self, runtime: Runtime) -> None:
        self._runtime = runtime
        self._by_context: dict[str, Conversation] = {}

    def __len__(self) -> int:
        return len(self._by_context)

    async def get(self, context_id: str, principal: Principal) -> Conversation:
        """The context's conversation: this node's, or one going on from where the store
        says the context is (its last task ran on another node, or this node forgot it);
        a new one for a context never seen.

        Raises:
            Refused: the context is another principal's (said as not found: whose it is
                is not told), or the store does not answer.
        """
        try:
            data = await self._runtime.store.get_named(context_name(context_id))
        except StoreUnavailable as exc:
            raise Refused(f"the conversation cannot be reached now: {exc}") from exc
        record = None if data is None else _decode_record(data)
        found = self._by_context.get(context_id)  # read after the await: no one else's
        theirs = (found is not None and found.principal.name != principal.name) or (
            record is not None and record.principal != principal.name
        )
        if theirs:
            raise Refused(f"no conversation {context_id!r} of this caller")
        if found is None:
            found = self._by_context[context_id] = Conversation(
                self._runtime, context_id, principal, self._forget
            )
        if record is not None:
            found.carry_on(record)
        return found

    def running(self, context_id: str, task_id: str) -> Conversation | None:
        """The context's conversation, if the task ``task_id`` runs in it."""
        found = self._by_context.get(context_id)
        if found is None or found.turn is None or found.turn.message_id != task_id:
            return None
        return found

    def _forget(self, conversation: Conversation) -> None:
        if self._by_context.get(conversation.context_id) is conversation:
            del self._by_context[conversation.context_id]
