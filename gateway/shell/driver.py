"""The asyncio shell around a Session: runs its effects and owns its timers.

Everything that happens to a session (a client frame, a model event, a tool's
return, a deadline, a socket coming or going) becomes one event in one queue,
applied in order by one task, so the session core never sees concurrency.

A session outlives its sockets: every event it sends is logged in the store
first, then queued on the attached connection, if any. A resume attaches a new
connection and replays the log from the client's ``last_seq``; a session with
no connection for ``session_ttl`` ends.

Durable points: the effects of the events applied in a row (up to ``_YIELD_EVERY``,
or until the queue is empty) are committed to the store in one write: the events to
send, the calls, and, with a durable store (Redis), the session's whole state. Only
then are they carried out (events sent, models and tools started). While a commit is
in flight new events queue up and go in the next one, so a fast stream costs one
store round trip per batch, not per delta.

The path of a text delta is kept short: while the loop has nothing to do (it waits on
an empty queue), the model's reader applies a text event to the core itself, in order,
and commits and writes it at once when it is the first of this round of the event loop
(a paced stream's every delta), or else once at the end of the round, from a callback
(``_flush_now``), for all the deltas of a burst. A client's ``ping`` takes the same path
from the socket's reader. Only
the memory store allows it (its commit never waits); on Redis every event goes through
the queue and batches as above.

With a durable store the session runs under a lease (``gateway.store.Lease``): a
commit under a lease another node took fails with ``LeaseLost``, and this driver lets
the session go without ending it. Its server tools still running finish here and their
outcomes are posted to the session's inbox for the node that owns it now.
"""

from __future__ import annotations

import asyncio
import functools
import time
from collections.abc import Awaitable, Callable, Coroutine, Iterable, Mapping, Sequence
from typing import Any, Protocol, cast

import msgspec
import structlog

from gateway.core.call import Call
from gateway.core.event import (
    CallModel,
    CancelModel,
    CancelTool,
    Disconnected,
    Effect,
    Event,
    ModelFailed,
    ModelOutput,
    RunTool,
    SaveCall,
    Send,
    ShuttingDown,
    Tick,
    ToolFinished,
    ToolProgress,
)
from gateway.core.model import ModelEvent, ModelFinish, ModelText
from gateway.core.session import LOG_ONLY, Session
from gateway.core.state import encode_item, encode_state
from gateway.core.text import SurrogatePairer, uncarriable
from gateway.errors import ProviderError, StoreUnavailable, closing
from gateway.providers.base import Provider, Pushes
from gateway.shell.connection import Connection
from gateway.shell.flag import Flag, Mailbox
from gateway.shell.inbox import Backlog
from gateway.shell.observe import LogObserver, SessionObserver
from gateway.store import Lease, LeaseLost, MemoryStore, Store
from gateway.tools.backend import Caller, Toolbox, failure_code, tool_failure
from gateway.tools.python import Progress
from gateway.wire.routing import decode_routed, encode_routed
from gateway.wire.v1 import (
    Ack,
    Error,
    Ping,
    ServerMsg,
    SessionResumed,
    SessionStart,
    SessionUpdate,
    encode,
)

__all__ = ["Crewmate", "Driver"]

log = structlog.get_logger("gateway.driver")


_CHECKPOINT_EVENTS = 256
_CHECKPOINT_SIZE = 64 * 2**10
"""With a durable store, the whole state is saved at least every this many events or
bytes of events even while a stream only adds text (see ``Driver._checkpoint``); far
below the log's own bounds, so the log always has what came after it."""

_YIELD_EVERY = 32
"""A session applies at most this many waiting events in a row before it lets the event
loop run the others (one ``sleep(0)``: a few µs, every 32 events)."""
_MODEL_YIELD_FIRST = 4
_MODEL_YIELD_EVERY = 16
"""A model step's reader hands the loop over after each of its first ``_MODEL_YIELD_FIRST``
events, then every this many it reads in one round of the loop (a burst; a paced stream
gives the loop back between its events anyway). ``bench/first_delta.py``: a 500-chunk
burst's first delta reaches the client 8 ms after the request, 25 ms without."""


_POSTING: set[asyncio.Task[None]] = set()
"""Posts of tool outcomes in flight (a task needs a reference until it is done)."""


class Crewmate(Protocol):
    """Another agent a session may be handed to: its model and its tools."""

    @property
    def provider(self) -> Provider: ...

    @property
    def toolbox(self) -> Toolbox: ...


class _Attach(msgspec.Struct, frozen=True):
    conn: Connection
    last_seq: int | None
    """``None`` for a new session; the client's cursor for a resume."""
    accepted: asyncio.Future[bool]
    """Resolved by the session's loop: ``True`` once it took the socket, ``False`` when the
    session ended first."""


class _Detach(msgspec.Struct, frozen=True):
    conn: Connection
    end: bool = False
    """The client closed normally (1000): it is done, the session ends now."""


class _Stop(msgspec.Struct, frozen=True):
    """The gateway is stopping: cut the response, close the socket with 1012, end (with a
    durable store: hand the session over as it is, for another node to carry on)."""


class _TakePosts(msgspec.Struct, frozen=True):
    """Something was posted to the session's inbox (a tool outcome from another node)."""


class _LetGo(msgspec.Struct, frozen=True):
    """The lease is lost (another node took the session): stop driving it."""


class _CloseSocket(msgspec.Struct, frozen=True):
    """Close ``conn`` once the events fed before this one have been queued on it."""

    conn: Connection
    code: int
    reason: str


class _FromClient(msgspec.Struct, frozen=True):
    """A frame the client sent, counted against the session's client backlog."""

    event: Event


_DriverEvent = _Attach | _Detach | _Stop | _CloseSocket | _TakePosts | _LetGo

_MODEL_BACKLOG = 256
"""Model events that may wait in a session's queue; a faster model stream waits for room."""


class _Rounds:
    """Counts the rounds of the event loop, lazily: ``current`` schedules one callback per
    round that asks (for all the sessions that ask), which moves the count on at the next.
    A driver whose previous delta went out in an earlier round writes this one at once;
    one more in the same round (a burst parsed from one read) waits for the round's end
    and goes with the rest, in one write.

    Should a loop close with its callback due, the count stays put and every later text
    waits for the end of its round: slower, never out of order.

    ``over_budget`` says when the sessions' own work in this round (from the first that
    asked) passed ``_ROUND_BUDGET``: a session loop then hands the event loop over before
    its next event, so that a round stays short and the paced streams' timers, which run
    first in the next, keep their beat. A thousand turns starting (or ending) at once then
    queue up behind each other instead of holding a thousand streams' deltas back.
    """

    __slots__ = ("_due", "_round", "_started")

    def __init__(self) -> None:
        self._round = 0
        self._due = False
        self._started = 0.0

    def current(self, loop: asyncio.AbstractEventLoop) -> int:
        if not self._due:
            self._due = True
            self._started = loop.time()
            loop.call_soon(self._next)
        return self._round

    def over_budget(self, loop: asyncio.AbstractEventLoop) -> bool:
        if not self._due:
            self.current(loop)
            return False
        return loop.time() - self._started > _ROUND_BUDGET

    def _next(self) -> None:
        self._round += 1
        self._due = False


_ROUND_BUDGET = 0.002
"""Seconds of the sessions' own work in one round of the event loop before a session loop
hands it over (see ``_Rounds``): well under the 10 ms a voice stream's beat may slip."""

_ROUNDS = _Rounds()


@functools.cache
def _pushes(kind: type) -> bool:
    """Whether providers of ``kind`` push (once per class: a protocol's ``isinstance``
    costs tens of microseconds)."""
    return issubclass(kind, Pushes)


class _PushedStep:
    """The sink a provider that pushes (``Pushes``) gives one step's events to: the same
    paths as ``Driver._pull_model``'s loop, called from the provider's callbacks.

    The loop keeps its own copy of these few lines: calling ``take`` for each streamed
    event cost the fan-out a fifth of its rate (measured, 3 interleaved repeats)."""

    __slots__ = ("_driver", "_pairer", "_response_id", "_step_id", "failed", "finished")

    def __init__(self, driver: Driver, step_id: str, response_id: str) -> None:
        self._driver = driver
        self._step_id = step_id
        self._response_id = response_id
        self._pairer = SurrogatePairer()
        self.finished = False
        self.failed = False

    def take(self, events: list[ModelEvent]) -> bool:
        driver = self._driver
        applied = False
        for received in events:
            if (
                type(received) is ModelText
                and not self._pairer.held
                and received.text.isascii()
                and driver._idle()
            ):
                driver._take_text(self._step_id, received.text)  # the short path
                applied = True
            elif not driver._feed_model(self._step_id, self._response_id, self._pairer, received):
                self.failed = True
                return False
            if type(received) is ModelFinish:
                self.finished = True
        if applied:
            driver._flush_soon()  # all of them in one write
        return True


class Driver:
    """Runs one Session for its whole life, across sockets.

    Args:
        session: the pure core to drive.
        provider: the model.
        tools: runs the session's server tools, whatever their backend.
        agents: the model and tools of each agent the session may be handed to
            (``transfer_to_agent``), by name; effects naming none of them take
            ``provider`` and ``tools``.
        store: the event log and call ledger.
        session_ttl: seconds the session waits for a resume once detached.
        clock: wall-clock seconds; deadlines on the wire are Unix times.
        observers: told every event the session sends, and its sockets coming and
            going (logs, metrics); by default, the log observer alone.
        check_schemas: checks the client-function schemas a ``session.start`` or
            ``session.update`` declares, off the event loop, before the core sees it (the
            core then finds them checked); without it, the core checks them itself.
        lease: the session's lease, with a durable store: every commit saves the whole
            state under it. ``None`` (the memory store, one node) saves events and calls.
        max_client_events: client frames that may wait in the session's queue (see
            ``feed_client``).
        adopted_from: for a session taken over from another node, the ``seq`` of the
            state the store has (the session was caught up from the log since): the log
            is never trimmed past it, and the first commit saves the whole state again.
    """

    # Slots: a driver has more attributes than a key-sharing instance dict holds (30), and
    # every session has one (about 1.4 KiB saved per session).
    __slots__ = (
        "_batched",
        "_changed",
        "_check_schemas",
        "_checkpoint_seq",
        "_client_backlog",
        "_clock",
        "_conn",
        "_detached_at",
        "_ending",
        "_events",
        "_flush_scheduled",
        "_history_mark",
        "_log_only",
        "_loop",
        "_model_backlog",
        "_observers",
        "_others",
        "_parked",
        "_pending",
        "_posts_read",
        "_provider",
        "_quick",
        "_round",
        "_since_checkpoint",
        "_since_checkpoint_size",
        "_store",
        "_store_failing",
        "_tasks",
        "_ticked_for",
        "_tool_keys",
        "_toolbox",
        "_ttl",
        "_uncommitted_outcomes",
        "_unyielded",
        "detached",
        "lease",
        "moved",
        "quiet",
        "session",
    )

    def __init__(
        self,
        session: Session,
        *,
        provider: Provider,
        tools: Toolbox,
        agents: Mapping[str, Crewmate] | None = None,
        store: Store,
        session_ttl: float,
        clock: Callable[[], float] = time.time,
        observers: Sequence[SessionObserver] | None = None,
        check_schemas: Callable[[list[dict[str, Any]]], Awaitable[None]] | None = None,
        lease: Lease | None = None,
        max_client_events: int = 256,
        adopted_from: int | None = None,
    ) -> None:
        self.session = session
        self._provider = provider
        self._toolbox = tools
        self._others = agents or {}
        self._store = store
        self._ttl = session_ttl
        self._clock = clock
        self._check_schemas = check_schemas
        self.lease = lease
        self._pending: list[Effect] = []
        """Effects of the events applied since the last commit, in order."""
        self._changed = False
        """An event was applied since the last commit (the state is to be saved)."""
        self._posts_read = 0
        """Posts at the head of the session's inbox applied since the last commit: the next
        commit takes them out (see ``_take_posts``)."""
        self._uncommitted_outcomes: list[ToolFinished | ToolProgress] = []
        """Server tools' outcomes applied since the last commit: should the commit fail
        for a lost lease, they are posted to the session's new owner."""
        self._log_only = adopted_from is None
        """Every event applied since the last commit only added to the log: model text,
        pings, acks, unreadable frames (see ``_checkpoint``). Not so for an adopted
        session: what it caught up from the log is saved in its state at once."""
        self._since_checkpoint = 0
        self._since_checkpoint_size = 0
        self._checkpoint_seq = session.last_seq if adopted_from is None else adopted_from
        """The ``seq`` of the last state the store took: the log keeps every event after
        it (a node taking the session over catches up from there)."""
        self._history_mark = session.history_mark
        """Where the transcript stood at the last state saved: the store has it so far."""
        self._batched = 0
        self._store_failing = False
        """The last commit failed: the client was told (``store_unavailable``)."""
        self.moved = False
        """The session left this node (lease lost, or handed over at shutdown): it goes on
        elsewhere, so it is not ended here."""
        self._quick = store if isinstance(store, MemoryStore) and lease is None else None
        """A store whose commit never waits: with it, text deltas take the short path (see
        the module docstring)."""
        self._parked = False
        """The loop waits for an event on an empty queue (``_next_event``)."""
        self._flush_scheduled = False
        """A ``_flush_now`` callback is due."""
        self._round = -1
        """The round of the event loop (``_ROUNDS``) of the last text flushed at once."""
        self._loop = asyncio.get_running_loop()
        self._events: Mailbox[Event | _DriverEvent | _FromClient] = Mailbox()
        self._client_backlog = Backlog(max_client_events)
        self._model_backlog = Backlog(_MODEL_BACKLOG)
        self._ticked_for: float | None = None
        """The passed deadline last given a ``Tick`` ahead of waiting events."""
        self._unyielded = 0
        """Events taken in a row without letting the loop run (see ``_next_event``)."""
        self._tasks: dict[str, asyncio.Task[None]] = {}
        """Model streams by step id and server tools by call id."""
        self._tool_keys: set[str] = set()
        """The keys of ``_tasks`` that are server tools."""
        self._observers: tuple[SessionObserver, ...] = (
            tuple(observers) if observers is not None else (LogObserver(lambda: session.metadata),)
        )
        self._conn: Connection | None = None
        self._ending = False
        """Set once the loop has stopped taking events: an attach is refused at once."""
        self._detached_at: float | None = clock()
        self.quiet = Flag(True)
        """Set while no response runs (graceful shutdown waits for it)."""
        self.detached = Flag(True)
        """Set while no socket is attached, so the TTL runs (tests and probes wait on it)."""

    @property
    def session_id(self) -> str:
        return self.session.session_id

    @property
    def connection(self) -> Connection | None:
        return self._conn

    @property
    def detached_since(self) -> float | None:
        """When (``clock`` time) the last socket went, while none is attached."""
        return self._detached_at

    def add_observer(self, observer: SessionObserver) -> None:
        """Tell ``observer`` too about the session from now on."""
        self._observers = (*self._observers, observer)

    def feed(self, event: Event) -> None:
        """Queue an event for the session (from any task of this loop)."""
        self._events.put_nowait(event)

    @property
    def client_room(self) -> Flag:
        """Set while the session's queue has room for another client frame (and once the
        session has ended): a socket's pump waits for it before ``feed_client``."""
        return self._client_backlog.room

    @property
    def client_backlog_peak(self) -> int:
        """The most client frames that waited in the session's queue at once so far."""
        return self._client_backlog.peak

    def feed_client(self, event: Event) -> None:
        """Queue a frame a client sent, counted against ``max_client_events``; the caller
        waits for ``client_room`` first. Model output, tool outcomes and sockets coming and
        going (``feed``, ``attach``...) are never held back by client frames."""
        if self._ending:
            return  # nobody applies it any more
        if type(event) is Ping and self._idle():
            self._apply(event)  # the short path (see the module docstring): a pong
            self._flush_soon()
            return
        self._client_backlog.add()
        self._events.put_nowait(_FromClient(event))

    def _idle(self) -> bool:
        """The loop waits on an empty queue and the store commits at once: an event that
        only adds to the log may be applied by whoever has it, in order, without waking
        the loop (the short path). Such an event moves no deadline."""
        return self._parked and self._quick is not None and self._events.empty()

    async def attach(self, conn: Connection, last_seq: int | None = None) -> bool:
        """Ask the session to take ``conn`` as its socket; with ``last_seq``, to replay what
        it missed first.

        Returns:
            ``True`` once the session's loop took the socket (what it missed, or the
            ``resume_gap`` error and a snapshot, is queued on it already); ``False`` when
            the session is ending or has ended, at once or as soon as it ends: the socket
            then belongs to no session.
        """
        return await self.attach_soon(conn, last_seq)

    def attach_soon(self, conn: Connection, last_seq: int | None = None) -> asyncio.Future[bool]:
        """``attach`` without waiting: the future gets its answer. Events fed after this
        call come after the socket is taken (a new session's first message, say), so its
        caller need not wait for the session's loop in between."""
        accepted: asyncio.Future[bool] = self._loop.create_future()
        if self._ending:
            accepted.set_result(False)
        else:
            self._events.put_nowait(_Attach(conn, last_seq, accepted))
        return accepted

    def detach(self, conn: Connection, *, end: bool = False) -> None:
        """``conn`` is gone; the session waits ``session_ttl`` for a resume, or with
        ``end`` (the client closed with 1000) ends now."""
        self._events.put_nowait(_Detach(conn, end))

    def stop(self) -> None:
        """Cut the running response, close the socket with 1012 and end the session."""
        self._events.put_nowait(_Stop())

    def close_socket(self, conn: Connection, code: int, reason: str) -> None:
        """Close ``conn`` with ``code`` after sending what the events fed so far produce
        (the errors that explain the close, say); the session waits for a resume."""
        self._events.put_nowait(_CloseSocket(conn, code, reason))

    def take_posts(self) -> None:
        """Something was posted to the session's inbox: take it (from any task)."""
        self._events.put_nowait(_TakePosts())

    def let_go(self) -> None:
        """The lease is lost: another node drives the session now."""
        self._events.put_nowait(_LetGo())

    async def run(self) -> None:
        """Apply events until the session ends; then cancel and await all its work.

        A session adopted from another node starts with what ``Session.adopt`` asked for
        and what was posted to its inbox meanwhile.
        """
        self._tell(lambda observer, now: observer.started(now))
        try:
            self._pending += self.session.effects()
            self._changed = bool(self._pending) or not self._log_only
            await self._flush()
            if self.lease is not None and not self.moved:
                await self._take_posts()
            while not self.session.closed and not self.moved:
                event = await self._next_event()
                if _ROUNDS.over_budget(self._loop):
                    await asyncio.sleep(0)  # the streams first (see _Rounds)
                if isinstance(event, _FromClient):
                    self._client_backlog.took()
                    event = event.event
                elif isinstance(event, ModelOutput):
                    self._model_backlog.took()
                if isinstance(
                    event, _Attach | _Detach | _Stop | _CloseSocket | _TakePosts | _LetGo
                ):
                    await self._flush()
                    if self.moved:  # that flush found the lease lost: it is not ours now
                        if isinstance(event, _Attach) and not event.accepted.done():
                            event.accepted.set_result(False)  # resumed where it is now
                        break
                    await self._handle(event)
                    continue
                if isinstance(event, Ack):
                    await self._trim(event.seq)
                if isinstance(event, SessionStart | SessionUpdate) and self._check_schemas:
                    await self._check_schemas(self.session.declared_schemas(event))
                self._apply(event)
                self._batched += 1
                if self._batched >= _YIELD_EVERY or self._events.empty():
                    await self._flush()
        finally:
            # No await before the queue is drained: an attach queued later is refused at once.
            self._ending = True
            self._drain()
            self._client_backlog.open()
            if self.moved:
                for outcome in self._uncommitted_outcomes:  # applied here, never committed
                    self._report(outcome)
                self._uncommitted_outcomes = []
                self._cancel_models()  # the tools go on: their outcomes are posted
                self._stop_tools_at_deadlines()
            else:
                await self._flush()
                if self.session.ended_by_agent and self._conn is not None:
                    # After the last answer and session.ended: a close that says why.
                    self._conn.end(closing("session_ended"), flush=True)
                await self._cancel_all()
                await self._end_in_store()
            self.quiet.set()
            self._tell(lambda observer, now: observer.ended(now))

    def _drain(self) -> None:
        """Empty the queue once the loop stopped: answer every attach still queued (the
        session ended before taking it), and give every server tool's outcome that came
        too late to the session's new owner, if it moved (one queued behind the news of
        the lost lease would be lost with the queue otherwise)."""
        while not self._events.empty():
            event = self._events.get_nowait()
            if isinstance(event, _Attach) and not event.accepted.done():
                event.accepted.set_result(False)
            elif isinstance(event, ToolFinished | ToolProgress) and self.moved:
                self._report(event)

    # ----------------------------------------------------------------- events

    def _receive(self, event: Event) -> None:
        """Give the core one event; what it asks for is done at the next flush."""
        try:
            self.session.receive(event, now=self._clock())
        except Exception:
            self._recover(event)
        self._pending += self.session.effects()
        self._changed = True

    def _recover(self, event: Event) -> None:
        """The core raised applying ``event``: whatever it was, it fails the step or the
        response it was part of, never the session (``Session.recover``)."""
        log.exception("session_core_failed", failed_on=type(event).__name__)
        self._log_only = False
        self.session.recover(event, now=self._clock())

    def _apply_text(self, step_id: str, text: str) -> None:
        """``_apply`` for a model's text on the short path, then ``_flush_soon``: it only
        adds to the log, and leaves the response running (unless the core failed it). The
        path of every delta: as few calls as can be."""
        self._take_text(step_id, text)
        self._flush_soon()

    def _take_text(self, step_id: str, text: str) -> None:
        """``_apply_text`` without the flush: the caller flushes after the last of several."""
        session = self.session
        try:
            session.model_text(step_id, text, now=self._clock())
        except Exception:
            self._recover(ModelOutput(step_id, ModelText(text)))
        self._pending += session.effects()
        self._changed = True
        if not session.responding:
            self.quiet.set()

    def _apply(self, event: Event) -> None:
        """``_receive``, and keep what the driver tracks of the session up to date."""
        self._receive(event)
        if not (
            isinstance(event, LOG_ONLY)
            or (isinstance(event, ModelOutput) and isinstance(event.event, ModelText))
        ):
            self._log_only = False
        if isinstance(event, ToolFinished | ToolProgress):
            self._uncommitted_outcomes.append(event)
        if self.session.responding:
            self.quiet.clear()
        else:
            self.quiet.set()

    async def _flush(self) -> None:
        """Commit what the events applied since the last flush produced, then do it."""
        self._batched = 0
        batch = self._take_batch()
        if batch is None:
            return
        effects, sends, calls, outcomes = batch
        state = self._checkpoint(sends)
        saved_seq = self.session.last_seq
        # The transcript goes apart from the rest of the state: only what changed.
        mark = self.session.history_mark
        dropped, added = self.session.history_since(self._history_mark) if state else (0, [])
        try:
            await self._store.commit(
                self.session_id,
                self.lease,
                state=state,
                events=[(msg.seq or 0, data) for msg, data in sends],
                calls=calls,
                history_drop=dropped,
                history=[encode_item(item) for item in added],
                posts_taken=self._posts_read,
            )
        except LeaseLost:
            log.warning("session_lease_lost", events=len(sends))
            self._move()
            for outcome in outcomes:  # applied here in vain: the session's owner needs them
                self._report(outcome)
            return
        except StoreUnavailable as exc:
            # Kept until a commit takes them: should the lease be lost meanwhile, they
            # are posted to the new owner.
            self._uncommitted_outcomes[:0] = outcomes
            self._store_down(exc)
        else:
            self._posts_read = 0
            if state is not None:
                self._history_mark = mark
                self._checkpoint_seq = saved_seq
            if self._store_failing:
                log.info("store_recovered")
                self._store_failing = False
        self._carry_out(effects, sends)

    def _flush_soon(self) -> None:
        """Flush what the short path applied: at once if it is the first of this round of
        the event loop (most likely alone: a paced delta, a ping), else with the rest of
        the round's, from a callback at its end (a burst, in one write)."""
        if self._flush_scheduled:
            return  # the flush due takes it too
        round_ = _ROUNDS.current(self._loop)
        if round_ != self._round:
            self._round = round_
            self._flush_now()
        else:
            self._flush_scheduled = True
            self._loop.call_soon(self._flush_now)

    def _flush_now(self) -> None:
        """``_flush`` with a commit that never waits, for what the short path applied;
        unless the loop is busy with an event: its own flush takes them, in order."""
        self._flush_scheduled = False
        quick = self._quick
        if not self._parked or quick is None:
            return
        batch = self._take_batch()
        if batch is None:
            return
        effects, sends, calls, _ = batch
        events = [(msg.seq or 0, data) for msg, data in sends]
        if calls:
            quick.commit_now(self.session.session_id, None, state=None, events=events, calls=calls)
        else:  # the usual case: deltas, pongs
            quick.log_now(self.session.session_id, events)
        self._carry_out(effects, sends)

    def _take_batch(
        self,
    ) -> tuple[list[Effect], list[tuple[ServerMsg, bytes]], list[Call], list[Any]] | None:
        """The effects pending since the last flush, the events among them encoded, the
        calls to save, and the tool outcomes they came from; ``None`` if there are none."""
        if not self._changed or self.moved:
            return None
        effects, self._pending, self._changed = self._pending, [], False
        outcomes, self._uncommitted_outcomes = self._uncommitted_outcomes, []
        sends: list[tuple[ServerMsg, bytes]] = []
        calls: list[Call] = []
        for effect in effects:
            if type(effect) is Send:
                sends.append((effect.msg, encode(effect.msg)))
            elif type(effect) is SaveCall:
                calls.append(effect.call)
        return effects, sends, calls, outcomes

    def _carry_out(self, effects: list[Effect], sends: list[tuple[ServerMsg, bytes]]) -> None:
        """Send the committed events, and start or stop what the other effects ask for."""
        self._notify_sent([msg for msg, _ in sends])
        conn = self._conn
        if len(sends) == len(effects):  # only events to send, as on the short path
            if conn is not None:
                conn.send_all(sends)  # all of them in one write
            return
        encoded = iter(sends)
        for effect in effects:
            if type(effect) is Send:
                msg, data = next(encoded)
                if conn is not None:
                    conn.queue(msg, data)
            elif type(effect) is not SaveCall:
                self._execute(effect)
        if conn is not None and sends:
            conn.flush()

    def _checkpoint(self, sends: list[tuple[ServerMsg, bytes]]) -> bytes | None:
        """The state to save with this commit, if any.

        With a durable store, every commit saves the whole state but one whose events only
        add to the log: text deltas of the streaming step, pongs, errors about unreadable
        frames. A node taking the session over catches up from the log
        (``Session.catch_up``). So a long stream costs a state write every
        ``_CHECKPOINT_EVENTS`` events or ``_CHECKPOINT_SIZE`` bytes, not at every batch, a
        ping costs no state write, and the log keeps what was sent since the last one.
        """
        log_only, self._log_only = self._log_only, True
        if self.lease is None:
            return None
        self._since_checkpoint += len(sends)
        self._since_checkpoint_size += sum(len(data) for _, data in sends)
        if (
            log_only
            and self._since_checkpoint < _CHECKPOINT_EVENTS
            and self._since_checkpoint_size < _CHECKPOINT_SIZE
        ):
            return None
        self._since_checkpoint = self._since_checkpoint_size = 0
        return encode_state(self.session.state(with_history=False))

    def _store_down(self, exc: StoreUnavailable) -> None:
        """The store did not take a commit: the session goes on live (the next commit
        saves the whole state again); a resume meanwhile may find a gap in the log."""
        self._changed = self.lease is not None  # save the state at the next flush
        self._log_only = False
        if self._store_failing:
            return
        self._store_failing = True
        log.warning("store_unavailable", error=str(exc))
        if self._conn is not None:
            error = Error(
                code="store_unavailable",
                message="the session store does not answer: this conversation goes on, but"
                " a reconnect may lose events until it is back",
                retryable=True,
            )
            self._conn.send(error, encode(error))

    def _move(self) -> None:
        """The session is another node's now: close the socket, stop driving.

        The socket is closed with 1013, which clients resume after, not 4009: the resume
        that took the session over elsewhere may have been this very client's, given up
        on (timed out) after it had reached the other node; its live socket is this one.
        """
        self.moved = True
        if self._conn is not None:
            self._conn.end(closing("session_moved"))

    async def _next_event(self) -> Event | _DriverEvent | _FromClient:
        expiry = self._expiry()
        due = self.session.next_deadline()
        if not self._events.empty():
            # A busy session (a fast stream, a chatty client) always has an event waiting,
            # and taking one from a queue that has one never lets the loop run: hand the
            # loop over now and then, or every other session and timer waits for this one.
            self._unyielded += 1
            if self._unyielded >= _YIELD_EVERY:
                self._unyielded = 0
                await asyncio.sleep(0)
            # A deadline that has passed goes first, or it would wait for a quiet moment.
            # Once per deadline: should the core keep a passed one, events still flow.
            if due is not None and due != self._ticked_for and self._clock() >= due:
                self._ticked_for = due
                return Tick()
            return self._events.get_nowait()
        self._unyielded = 0
        deadline = min((d for d in (due, expiry) if d is not None), default=None)
        # Parked: a model's text may be applied meanwhile by its reader (the short path),
        # which moves no deadline (calls come with a step's end, never with its text).
        self._parked = True
        try:
            if deadline is None:
                return await self._events.get()
            async with asyncio.timeout(max(0.0, deadline - self._clock())):
                return await self._events.get()
        except TimeoutError:
            if expiry is not None and self._clock() >= expiry:
                log.info("session_expired", session_ttl=self._ttl)
                return Disconnected()
            return Tick()
        finally:
            self._parked = False

    def _expiry(self) -> float | None:
        """When a detached session ends; one never started ends with its socket."""
        if self._detached_at is None:
            return None
        return self._detached_at + (self._ttl if self.session.started else 0.0)

    async def _handle(self, event: _DriverEvent) -> None:
        match event:
            case _Attach():
                try:
                    await self._attach(event)
                finally:  # should the replay fail, the resuming client still gets an answer
                    if not event.accepted.done():
                        event.accepted.set_result(False)
            case _Detach(conn=conn, end=end) if conn is self._conn:
                self._conn, self._detached_at = None, self._clock()
                self.detached.set()
                log.info("session_detached", last_seq=self.session.last_seq, ended=end)
                self._tell(lambda observer, now: observer.detached(ended=end, now=now))
                if end:
                    self._apply(Disconnected())
                    await self._flush()
            case _CloseSocket(conn=conn, code=code, reason=reason):
                conn.close(code, reason, flush=True)
            case _Stop() if self.lease is not None:
                # Handed over as it is: the node the client reconnects to carries it on
                # from its last durable point (a step cut here runs again there).
                self.moved = True
                if self._conn is not None:
                    self._conn.end(closing("service_restart"), flush=True)
                await self._release()
            case _Stop():
                self._apply(ShuttingDown())
                await self._flush()
                if self._conn is not None:
                    self._conn.end(closing("service_restart"), flush=True)
                self._apply(Disconnected())
                await self._flush()
            case _TakePosts():
                await self._take_posts()
            case _LetGo():
                log.warning("session_lease_lost")
                self._move()
            case _:
                pass

    async def _take_posts(self) -> None:
        """Apply what other nodes posted for the session (tool outcomes and progress). The
        next commit takes them out of the inbox: should this node lose the session or die
        first, they stay there for the next owner (so they are not posted again)."""
        try:
            posts = await self._store.read_posts(self.session_id)
        except StoreUnavailable as exc:
            self._store_down(exc)
            return
        if not posts:
            return
        ours = len(self._uncommitted_outcomes)
        for data in posts:
            routed = decode_routed(data)
            if routed is None:
                log.error("post_unreadable", size=len(data))
                continue
            self._apply(routed)  # again, if read before and not yet taken: applied once
        del self._uncommitted_outcomes[ours:]  # they are in the inbox still
        self._posts_read = len(posts)  # from the inbox's head: what the next commit takes
        self._changed = True
        await self._flush()

    async def _trim(self, upto_seq: int) -> None:
        """The client has every event up to ``upto_seq``: the log may drop them (but
        those after the last state saved: a node taking the session over needs them)."""
        if self.lease is not None:
            upto_seq = min(upto_seq, self._checkpoint_seq)
        try:
            await self._store.trim_events(self.session_id, upto_seq)
        except StoreUnavailable as exc:  # they go with a later ack, or with the session
            self._store_down(exc)

    async def _end_in_store(self) -> None:
        try:
            await self._store.end_session(self.session_id)
        except StoreUnavailable as exc:  # its keys expire by themselves
            log.warning("session_not_ended_in_store", error=str(exc))

    async def _release(self) -> None:
        """Give the lease back, so that another node can take the session at once."""
        if self.lease is None:
            return
        try:
            await self._store.release(self.session_id, self.lease)
        except StoreUnavailable as exc:  # it expires by itself
            log.warning("lease_not_released", error=str(exc))

    async def _attach(self, event: _Attach) -> None:
        if event.accepted.done():  # the attaching task was cancelled (its socket went)
            return
        conn, last_seq = event.conn, event.last_seq
        if conn.peer_gone and self._conn is not None:
            # A resume its client gave up on (it resumed on another socket meanwhile):
            # taking it would close the client's live socket. Its transport finds the
            # socket ended and lets it go.
            log.info("stale_resume_ignored", last_seq=last_seq)
            event.accepted.set_result(True)
            return
        missed: tuple[list[bytes] | None, StoreUnavailable | None] = (None, None)
        if last_seq is not None:
            try:
                missed = await self._missed(last_seq)
            except LeaseLost:
                # Another node took the session over since this resume found it here: the
                # client resumes there (its transport asks the store again), and this
                # node's socket, if it has one, closes with 1013.
                log.warning("session_lease_lost", at="resume")
                self._move()
                event.accepted.set_result(False)
                return
        replaced = self._conn if self._conn is not conn else None
        if replaced is not None:
            log.info("session_taken_over")
            replaced.end(closing("taken_over"))
        self._conn, self._detached_at = conn, None
        self._tell(
            lambda observer, now: observer.attached(
                resumed=last_seq is not None, replaced=replaced is not None, now=now
            )
        )
        self.detached.clear()
        if last_seq is not None:
            self._replay(conn, last_seq, *missed)
        event.accepted.set_result(True)

    async def _missed(self, last_seq: int) -> tuple[list[bytes] | None, StoreUnavailable | None]:
        """The logged events after ``last_seq`` (``None``: some are gone, or the client is
        ahead), read under the session's lease, and the store's failure if it failed.

        Raises:
            LeaseLost: the lease is no longer this node's: nothing may be replayed from
                here (the log may hold events this session never had).
        """
        if last_seq > self.session.last_seq and self.lease is None:
            return None, None
        try:
            events = await self._store.events_after(self.session_id, last_seq, lease=self.lease)
        except StoreUnavailable as exc:  # the live session rebuilds the client instead
            return None, exc
        return (events if last_seq <= self.session.last_seq else None), None

    def _replay(
        self,
        conn: Connection,
        last_seq: int,
        events: list[bytes] | None,
        store_error: StoreUnavailable | None,
    ) -> None:
        """Send a resuming client what it missed (``events``, from ``_missed``), before any
        live event; or the ``resume_gap`` error and a snapshot if it cannot be replayed."""
        now = self._clock()
        head = self.session.last_seq
        if events is not None and len(events) != head - last_seq:
            events = None  # a hole: events the store did not take while it was down
        if events is None:
            log.info("resume_gap", last_seq=last_seq, head=head)
            why = (
                f"last_seq {last_seq} is ahead of this session (newest seq {head})"
                if last_seq > head
                else f"events after seq {last_seq} are gone"
            )
            error = Error(code="resume_gap", message=f"{why}; rebuild from the snapshot")
            snapshot = self.session.snapshot(now)
            conn.replay(encode(error))
            conn.replay(encode(snapshot))
            self._notify_sent((error, snapshot))
            if store_error is not None:  # after the snapshot: the client resumed first
                self._store_down(store_error)
            return
        resumed = SessionResumed(
            session_id=self.session_id,
            replayed_from=last_seq + 1,
            last_seq=head,
            agent=self.session.agent,
            open_calls=self.session.open_client_calls(now),
            open_confirmations=self.session.open_confirmations(now),
        )
        conn.replay(encode(resumed))
        self._notify_sent((resumed,))  # the replayed events were observed when first sent
        for data in events:
            conn.replay(data)
        log.info("session_resumed", last_seq=last_seq, replayed=len(events))

    # ----------------------------------------------------------------- effects

    def _execute(self, effect: Effect) -> None:
        """Carry out an effect other than a send (committed already, as are calls)."""
        match effect:
            case CallModel(step_id=step_id):
                self._start(step_id, self._stream_model(effect))
            case RunTool(call_id=call_id):
                log.info(
                    "tool_started",
                    call_id=call_id,
                    tool=effect.tool,
                    response_id=effect.response_id,
                )
                self._tool_keys.add(call_id)
                self._start(call_id, self._run_tool(effect))
            case CancelModel(step_id=key) | CancelTool(call_id=key):
                task = self._tasks.get(key)
                if task is not None:
                    task.cancel()

    def _start(self, key: str, work: Coroutine[Any, Any, None]) -> None:
        # A done callback, not a wrapping coroutine: a model stream resumes once per delta,
        # and each resume would pass through one more frame.
        task = asyncio.create_task(work, name=f"gateway:{key}")
        self._tasks[key] = task
        task.add_done_callback(lambda _: self._forget_task(key, task))

    def _forget_task(self, key: str, task: asyncio.Task[None]) -> None:
        if self._tasks.get(key) is task:
            del self._tasks[key]
            self._tool_keys.discard(key)

    async def _stream_model(self, effect: CallModel) -> None:
        """Feed the model's events for one step to the core. Nothing the model sends
        may end the session: whatever fails here fails the step, and so the response."""
        step_id = effect.step_id
        other = self._others.get(effect.agent)
        provider = self._provider if other is None else other.provider
        try:
            played = None
            if _pushes(type(provider)):
                step = _PushedStep(self, step_id, effect.response_id)
                pushing = cast(Pushes, provider)
                played = pushing.push(effect.request, step.take, self._model_backlog)
            if played is not None:
                await played
                finished = step.finished or step.failed
            else:
                finished = await self._pull_model(effect, provider)
        except ProviderError as exc:
            log.warning("model_failed", response_id=effect.response_id, error=str(exc))
            self.feed(ModelFailed(step_id, f"the model failed: {exc}", retryable=exc.retryable))
            return
        except Exception:
            log.exception("model_crashed", response_id=effect.response_id)
            self.feed(ModelFailed(step_id, "the model failed unexpectedly"))
            return
        if not finished:
            self.feed(ModelFailed(step_id, "the model stream ended before it finished"))

    async def _pull_model(self, effect: CallModel, provider: Provider) -> bool:
        """``_stream_model`` for a model that streams: ``False`` when its stream ended
        before it finished (``True`` too when the step failed: it is over)."""
        step_id = effect.step_id
        fed = burst = 0
        seen_round = -1
        pairer = SurrogatePairer()  # an emoji cut in two by the server must not end anything
        async for received in provider.stream(effect.request):
            if (
                type(received) is ModelText
                and not pairer.held
                and received.text.isascii()
                and self._idle()
            ):
                # Most events: the short path (the loop is idle, so applying the text
                # here keeps the order and saves two task switches per delta), for a
                # text the surrogate pairer would pass untouched.
                self._apply_text(step_id, received.text)
            elif not self._feed_model(step_id, effect.response_id, pairer, received):
                return True
            fed += 1
            round_ = _ROUNDS.current(self._loop)
            if round_ != seen_round:
                seen_round, burst = round_, 0
            burst += 1
            if fed <= _MODEL_YIELD_FIRST or burst % _MODEL_YIELD_EVERY == 0:
                # A burst parsed from one read never yields on its own: hand the loop
                # to the session and its socket's writer now and then, and after each
                # of the step's first events (the first delta takes a few turns of
                # the loop to reach the socket), so it goes out before the rest is read.
                # A paced stream yields between its events anyway: no extra turn.
                await asyncio.sleep(0)
            if self._model_backlog.full:
                await self._model_backlog.room.wait()  # a fast model waits for the session
            if type(received) is ModelFinish:
                return True
        return False

    def _feed_model(
        self, step_id: str, response_id: str, pairer: SurrogatePairer, received: ModelEvent
    ) -> bool:
        """Feed one event of the model (what the pairer makes of it) to the session;
        ``False`` when it cannot be carried (the step has failed)."""
        for event in pairer.events(received):
            if type(event) is ModelText and self._idle():
                self._apply_text(step_id, event.text)  # the short path, as above
                continue
            problem = uncarriable(event)
            if problem is not None:
                log.warning("model_output_refused", response_id=response_id)
                self.feed(ModelFailed(step_id, problem, retryable=False))
                return False
            self._model_backlog.add()
            self.feed(ModelOutput(step_id, event))
        return True

    async def _run_tool(self, effect: RunTool) -> None:
        started = self._clock()
        call_id = effect.call_id
        progress = Progress(
            lambda payload: self._report(ToolProgress(call_id=call_id, payload=payload))
        )
        other = self._others.get(effect.agent)
        toolbox = self._toolbox if other is None else other.toolbox
        try:
            output = await toolbox.call(
                effect.tool,
                effect.args,
                progress,
                Caller.of(self.session.principal, self.session.time_zone),
            )
        except Exception as exc:
            log.warning(
                "tool_raised", call_id=effect.call_id, tool=effect.tool, error=type(exc).__name__
            )
            self._report(
                ToolFinished(
                    call_id=effect.call_id, error=tool_failure(exc), code=failure_code(exc)
                )
            )
        else:
            log.info(
                "tool_returned",
                call_id=effect.call_id,
                tool=effect.tool,
                duration_ms=round((self._clock() - started) * 1000, 1),
            )
            self._report(ToolFinished(call_id=effect.call_id, output=output))

    def _report(self, event: ToolFinished | ToolProgress) -> None:
        """A server tool's outcome or progress: for this driver, or, once the session
        moved to another node, posted to its inbox there."""
        if not self.moved:
            self.feed(event)
            return
        task = asyncio.create_task(self._post(event), name=f"gateway:post:{event.call_id}")
        _POSTING.add(task)
        task.add_done_callback(_POSTING.discard)

    async def _post(self, event: ToolFinished | ToolProgress) -> None:
        try:
            await self._store.post(self.session_id, encode_routed(event))
        except StoreUnavailable as exc:
            log.warning("tool_outcome_not_posted", call_id=event.call_id, error=str(exc))
        else:
            log.info("tool_outcome_posted", call_id=event.call_id)

    def _stop_tools_at_deadlines(self) -> None:
        """The server tools still running here, for a session that left: each is cancelled
        at its call's deadline (no core here does it any more)."""
        loop = asyncio.get_running_loop()
        deadlines = {call.call_id: call.deadline for call in self.session.state().calls}
        for call_id in self._tool_keys:
            task = self._tasks.get(call_id)
            if task is not None:
                delay = max(0.0, deadlines.get(call_id, 0.0) - self._clock())
                loop.call_later(delay, task.cancel)

    def _cancel_models(self) -> None:
        for key, task in self._tasks.items():
            if key not in self._tool_keys:
                task.cancel()

    async def _cancel_all(self) -> None:
        tasks = list(self._tasks.values())
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)

    # ----------------------------------------------------------------- observers

    def _notify_sent(self, msgs: Iterable[ServerMsg]) -> None:
        # On the path of every delta: a plain loop, no closure per event.
        now = self._clock()
        for msg in msgs:
            for observer in self._observers:
                try:
                    observer.sent(msg, now)
                except Exception:
                    log.exception("observer_failed", observer=type(observer).__name__)

    def _tell(self, news: Callable[[SessionObserver, float], None]) -> None:
        """Give every observer the news; one failing observer costs the others nothing."""
        now = self._clock()
        for observer in self._observers:
            try:
                news(observer, now)
            except Exception:
                log.exception("observer_failed", observer=type(observer).__name__)
