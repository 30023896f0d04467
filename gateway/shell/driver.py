"""The asyncio shell around a Session: runs its effects and owns its timers.

Everything that happens to a session (a client frame, a model event, a tool's return, a
deadline, a socket coming or going) becomes one event in one queue
(``gateway.shell.session_queue``), applied in order by one task, so the session core never
sees concurrency. A session outlives its sockets: every event it sends is logged in the
store first (``gateway.shell.journal``), then sent on the attached connection, if any
(``gateway.shell.effects``); a resume attaches a new one and replays the log from the
client's ``last_seq`` (``gateway.shell.replay``); a session with no connection for
``session_ttl`` ends.

The path of a text delta is kept short: while the loop has nothing to do (it waits on an
empty queue), the model's reader (``gateway.shell.model_stream``) applies a text event to the
core itself, in order (``_take_text``), and commits and writes it at once when it is the
first of this round of the event loop (a paced stream's every delta), or else once at the
end of the round, from a callback, for all the deltas of a burst (``Journal.flush_soon``,
``gateway.shell.rounds``). A client's ``ping`` takes the same path from the socket's reader.
Only the memory store allows it (its commit never waits); on Redis every event goes through
the queue, and the effects of the events applied in a row are committed in one write.

With a durable store the session runs under a lease (``gateway.store.Lease``): once another
node took it, this driver lets the session go without ending it; its server tools still
running finish here and their outcomes are posted to the node that owns it now
(``gateway.shell.tool_runner``).
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Awaitable, Callable, Coroutine, Mapping, Sequence
from typing import Any, Literal, Protocol

import structlog

from gateway.core.event import (
    CallModel,
    Disconnected,
    Event,
    Listen,
    ModelOutput,
    ShuttingDown,
    Tick,
    ToolNews,
)
from gateway.core.model import ModelText
from gateway.core.session import Session
from gateway.errors import closing
from gateway.providers.base import Provider
from gateway.providers.realtime import RealtimeProvider
from gateway.shell.connection import Connection
from gateway.shell.devices import Devices
from gateway.shell.effects import Effects
from gateway.shell.flag import Flag
from gateway.shell.journal import Journal
from gateway.shell.meter import SessionMeter
from gateway.shell.model_stream import ModelStep
from gateway.shell.observe import LogObserver, SessionObserver
from gateway.shell.realtime_voice import RealtimeVoice
from gateway.shell.replay import missed, replay
from gateway.shell.rounds import ROUNDS
from gateway.shell.session_queue import (
    YIELD_EVERY,
    Attach,
    CloseSocket,
    Detach,
    Device,
    DriverEvent,
    FromClient,
    LetGo,
    SessionQueue,
    Stop,
    TakePosts,
)
from gateway.shell.tool_runner import ToolRunner
from gateway.shell.voice import AUDIO_OFF, SessionVoice, VoiceEffect, VoicePool
from gateway.store import Lease, LeaseLost, Store
from gateway.tools.toolbox import Toolbox
from gateway.wire.v1 import (
    Ack,
    Ping,
    SessionGoingAway,
    SessionStart,
    SessionUpdate,
    encode,
)

__all__ = ["Crewmate", "Driver", "GoingAwayReason"]

GoingAwayReason = Literal["shutdown", "session_moved", "max_socket_age"]

log = structlog.get_logger("gateway.driver")


class Crewmate(Protocol):
    """Another agent a session may be handed to: its model and its tools."""

    @property
    def provider(self) -> Provider: ...

    @property
    def toolbox(self) -> Toolbox: ...


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
        voice: the node's speech engines, for a session that turns audio on (``None``:
            none; the core then refuses audio, its settings have no voices).
        meter: the session's metering: each model step reserved against its usage
            limits first (``None``: no metering).
    """

    # Slots: every session has a driver (a slotted instance holds no dict).
    __slots__ = (
        "_batched",
        "_check_schemas",
        "_clock",
        "_detached_at",
        "_devices",
        "_effects",
        "_events",
        "_journal",
        "_loop",
        "_meter",
        "_others",
        "_provider",
        "_queue",
        "_quick",
        "_retired_voice",
        "_store",
        "_tools",
        "_ttl",
        "_voice",
        "_voice_pool",
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
        voice: VoicePool | None = None,
        meter: SessionMeter | None = None,
    ) -> None:
        self.session = session
        self._meter = meter
        self._voice_pool = voice
        self._voice: SessionVoice | RealtimeVoice | None = None
        self._retired_voice: asyncio.Task[None] | None = None
        """The voice of the agent before a hand-over, closing."""
        """The session's audio, made when it is first turned on."""
        self._provider = provider
        self._others = agents or {}
        self._store = store
        self._ttl = session_ttl
        self._clock = clock
        self._check_schemas = check_schemas
        self.lease = lease
        self._loop = asyncio.get_running_loop()
        self._queue = SessionQueue(max_client_events=max_client_events, clock=clock)
        self._events = self._queue.events  # bound once: on the path of every event
        self._tools = ToolRunner(self, toolbox=tools, agents=self._others, store=store, clock=clock)
        self._effects = Effects(
            observers=(
                observers if observers is not None else (LogObserver(lambda: session.metadata),)
            ),
            clock=clock,
            tools=self._tools,
            model_step=self._model_step,
            voice=self._voice_effect,
        )
        self._devices = Devices(self._effects, session)
        self._journal = Journal(
            session,
            store,
            lease,
            adopted_from=adopted_from,
            queue=self._queue,
            effects=self._effects,
        )
        self._quick = self._journal.quick
        """The store commits at once: text deltas may take the short path (see the module
        docstring)."""
        self._batched = 0
        self.moved = False
        """The session left this node (lease lost, or handed over at shutdown): it goes on
        elsewhere, so it is not ended here."""
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
        """The socket that attached last, if any (see ``connections``)."""
        return self._effects.conn

    @property
    def connections(self) -> list[Connection]:
        """Every socket attached now: one, or one per device sharing the session."""
        return list(self._effects.conns)

    def going_away(
        self, reason: GoingAwayReason, time_left: float, conn: Connection | None = None
    ) -> None:
        """Tell ``conn`` (every attached socket when ``None``) that the gateway closes it in
        ``time_left`` seconds for its own reasons (``session.going_away``): its client
        opens the next socket and resumes there first. Outside the session's log: news
        about the socket, not the conversation."""
        notice = SessionGoingAway(reason=reason, time_left=round(max(0.0, time_left), 3))
        data = encode(notice)
        for socket in self._effects.conns if conn is None else [conn]:
            if socket in self._effects.conns and not socket.closing:
                socket.send(notice, data)

    @property
    def detached_since(self) -> float | None:
        """When (``clock`` time) the last socket went, while none is attached."""
        return self._detached_at

    def add_observer(self, observer: SessionObserver) -> None:
        """Tell ``observer`` too about the session from now on."""
        self._effects.add_observer(observer)

    def feed(self, event: Event) -> None:
        """Queue an event for the session (from any task of this loop)."""
        self._events.put_nowait(event)

    @property
    def client_room(self) -> Flag:
        """Set while the session's queue has room for another client frame (and once the
        session has ended): a socket's pump waits for it before ``feed_client``."""
        return self._queue.client_backlog.room

    @property
    def client_backlog_peak(self) -> int:
        """The most client frames that waited in the session's queue at once so far."""
        return self._queue.client_backlog.peak

    def feed_client(self, event: Event, conn: Connection | None = None) -> None:
        """Queue a frame a client sent (on ``conn``), counted against
        ``max_client_events``; the caller waits for ``client_room`` first. Model output,
        tool outcomes and sockets coming and going (``feed``, ``attach``...) are never held
        back by client frames."""
        if self._queue.closed:
            return  # nobody applies it any more
        if type(event) is Ping and self._idle():
            self._receive(event)  # the short path (see the module docstring): a pong
            self._journal.flush_soon()
            return
        self._queue.put_client(event, conn)

    async def feed_audio(self, pcm: bytes) -> None:
        """A binary frame the client sent: the user's audio (``gateway.shell.voice``);
        waits while the session's audio backlog is full."""
        if self._voice is None:
            self.feed_client(AUDIO_OFF)
        else:
            await self._voice.hear(pcm)

    def _voice_effect(self, effect: VoiceEffect) -> None:
        """Carry out a voice effect; the session's voice is made at the first."""
        if self._voice is None:
            if isinstance(self._provider, RealtimeProvider):
                self._voice = self._realtime(self._provider)
            elif self._voice_pool is None:
                return  # the core never asks without voices: a node with none
            else:
                self._voice = SessionVoice(
                    self._voice_pool,
                    conn=lambda: self._effects.conn,
                    feed=self.feed,
                    responding=lambda: self.session.responding,
                )
        self._voice.carry_out(effect)

    def _realtime(self, provider: RealtimeProvider) -> RealtimeVoice:
        """The session's link to its speech-to-speech model: its voice and its steps."""
        voice = self._voice
        if isinstance(voice, RealtimeVoice) and voice.provider is provider:
            return voice
        if voice is not None:  # another agent's (a hand-over): it says no more
            self._retired_voice = asyncio.create_task(voice.aclose())
        link = self._voice = RealtimeVoice(
            provider,
            conn=lambda: self._effects.conn,
            feed=self.feed,
            model_request=self.session.model_request,
        )
        return link

    def _idle(self) -> bool:
        """The loop waits on an empty queue and the store commits at once: an event that
        only adds to the log may be applied by whoever has it, in order, without waking
        the loop (the short path). Such an event moves no deadline."""
        return self._queue.parked and self._quick and self._events.empty()

    async def attach(
        self, conn: Connection, last_seq: int | None = None, device: Device | None = None
    ) -> bool:
        """Ask the session to take ``conn`` as its socket; with ``last_seq``, to replay what
        it missed first. With ``device``, the socket is that device's among others
        (``session.attach``, or a resume naming its device); without, it takes the whole
        session (a new one's socket, or a resume that takes it over).

        Returns:
            ``True`` once the session's loop took the socket (what it missed, or the
            ``resume_gap`` error and a snapshot, is queued on it already); ``False`` when
            the session is ending or has ended, at once or as soon as it ends: the socket
            then belongs to no session.
        """
        return await self.attach_soon(conn, last_seq, device)

    def attach_soon(
        self, conn: Connection, last_seq: int | None = None, device: Device | None = None
    ) -> asyncio.Future[bool]:
        """``attach`` without waiting: the future gets its answer. Events fed after this
        call come after the socket is taken (a new session's first message, say), so its
        caller need not wait for the session's loop in between."""
        return self._queue.attach(conn, last_seq, device)

    def detach(self, conn: Connection, *, end: bool = False) -> None:
        """``conn`` is gone; the session waits ``session_ttl`` for a resume, or with
        ``end`` (the client closed with 1000) ends now."""
        self._events.put_nowait(Detach(conn, end))

    def stop(self) -> None:
        """Cut the running response, close the socket with 1012 and end the session."""
        self._events.put_nowait(Stop())

    def close_socket(self, conn: Connection, code: int, reason: str) -> None:
        """Close ``conn`` with ``code`` after sending what the events fed so far produce
        (the errors that explain the close, say); the session waits for a resume."""
        self._events.put_nowait(CloseSocket(conn, code, reason))

    def take_posts(self) -> None:
        """Something was posted to the session's inbox: take it (from any task)."""
        self._events.put_nowait(TakePosts())

    def let_go(self) -> None:
        """The lease is lost: another node drives the session now."""
        self._events.put_nowait(LetGo())

    async def run(self) -> None:
        """Apply events until the session ends; then cancel and await all its work.

        A session adopted from another node starts with what ``Session.adopt`` asked for
        and what was posted to its inbox meanwhile.
        """
        self._effects.tell(lambda observer, now: observer.started(now))
        if self.session.audio is not None:  # taken over with its audio on
            self._voice_effect(Listen(self.session.audio))
        try:
            self._journal.opened(self.session.effects())
            await self._flush()
            if self.lease is not None and not self.moved:
                await self._take_posts()
            while not self.session.closed and not self.moved:
                expiry = self._expiry()
                event = await self._queue.next(self.session.next_deadline(), expiry)
                if event is None:
                    event = self._timed_out(expiry)
                if ROUNDS.over_budget(self._loop):
                    await asyncio.sleep(0)  # the streams first (see gateway.shell.rounds)
                source = None
                if isinstance(event, FromClient):
                    self._queue.client_backlog.took()
                    source, event = event.conn, event.event
                elif isinstance(event, ModelOutput):
                    self._queue.model_backlog.took()
                if isinstance(event, Attach | Detach | Stop | CloseSocket | TakePosts | LetGo):
                    await self._flush()
                    if self.moved:  # that flush found the lease lost: it is not ours now
                        if isinstance(event, Attach) and not event.accepted.done():
                            event.accepted.set_result(False)  # resumed where it is now
                        break
                    await self._handle(event)
                    continue
                if isinstance(event, Ack):
                    await self._journal.trim(self._devices.acked(event.seq, source))
                declared = None
                if isinstance(event, SessionUpdate) and source is not None:
                    event, declared = self._devices.merged(event, source)
                if isinstance(event, SessionStart | SessionUpdate) and self._check_schemas:
                    await self._check_schemas(self.session.declared_schemas(event))
                self._receive(event)
                if declared is not None and isinstance(event, SessionUpdate):
                    self._devices.took(event, source, declared)
                self._batched += 1
                if self._batched >= YIELD_EVERY or self._events.empty():
                    await self._flush()
        finally:
            # No await before the queue is drained: an attach queued later is refused at once.
            self._drain()
            if self.moved:
                for outcome in self._journal.take_outcomes():  # applied here, never committed
                    self._tools.report(outcome)
                self._effects.leave()  # the tools go on: their outcomes are posted
            else:
                await self._flush()
                if self.session.ended_by_agent:
                    # After the last answer and session.ended: a close that says why.
                    self._end_socket("session_ended", flush=True)
                await self._effects.cancel_all()
                await self._journal.end()
            if self._voice is not None:
                await self._voice.aclose()
            if self._retired_voice is not None:
                await self._retired_voice
            self.quiet.set()
            self._effects.tell(lambda observer, now: observer.ended(now))

    def _drain(self) -> None:
        """Empty the queue once the loop stopped, and give every server tool's outcome that
        came too late to the session's new owner, if it moved (one queued behind the news
        of the lost lease would be lost with the queue otherwise)."""
        for event in self._queue.drain():
            if isinstance(event, ToolNews) and self.moved:
                self._tools.report(event)

    # ----------------------------------------------------------------- events

    def _recover(self, event: Event) -> None:
        """The core raised applying ``event``: whatever it was, it fails the step or the
        response it was part of, never the session (``Session.recover``)."""
        log.exception("session_core_failed", failed_on=type(event).__name__)
        self._journal.changed_state()
        self.session.recover(event, now=self._clock())

    def _take_text(self, step_id: str, text: str) -> None:
        """``_receive`` for a model's text on the short path; the caller flushes after the
        last of several (``Journal.flush_soon``). It only adds to the log, and leaves the
        response running (unless the core failed it). The path of every delta: as few
        calls as can be."""
        session = self.session
        try:
            session.model_text(step_id, text, now=self._clock())
        except Exception:
            self._recover(ModelOutput(step_id, ModelText(text)))
        journal = self._journal
        journal.pending += session.effects()
        journal.changed = True
        if not session.responding:
            self.quiet.set()

    def _receive(self, event: Event) -> None:
        """Give the core one event; what it asks for is done at the next flush."""
        try:
            self.session.receive(event, now=self._clock())
        except Exception:
            self._recover(event)
        self._journal.applied(event)
        if self.session.responding:
            self.quiet.clear()
        else:
            self.quiet.set()

    async def _flush(self) -> None:
        """Commit what the events applied since the last flush produced, then do it."""
        self._batched = 0
        if self.moved:
            return
        lost = await self._journal.flush()
        if lost is not None:  # the lease is lost
            self._move()
            for outcome in lost:  # applied here in vain: the session's owner needs them
                self._tools.report(outcome)

    def _move(self) -> None:
        """The session is another node's now: close the socket, stop driving.

        The socket is closed with 1013, which clients resume after, not 4009: the resume
        that took the session over elsewhere may have been this very client's, given up
        on (timed out) after it had reached the other node; its live socket is this one.
        """
        self.moved = True
        self.going_away("session_moved", 0.0)
        self._end_socket("session_moved")

    def _end_socket(self, label: str, *, flush: bool = False) -> None:
        """Close the session's sockets, if any is attached, with the close for ``label``."""
        for conn in list(self._effects.conns):
            conn.end(closing(label), flush=flush)

    def _timed_out(self, expiry: float | None) -> Event:
        """The wait for the next event timed out: the session expired, or a deadline of
        the core passed."""
        if expiry is not None and self._clock() >= expiry:
            log.info("session_expired", session_ttl=self._ttl)
            return Disconnected()
        return Tick()

    def _expiry(self) -> float | None:
        """When a detached session ends; one never started ends with its socket."""
        if self._detached_at is None:
            return None
        return self._detached_at + (self._ttl if self.session.started else 0.0)

    async def _handle(self, event: DriverEvent) -> None:
        match event:
            case Attach():
                try:
                    await self._attach(event)
                finally:  # should the replay fail, the resuming client still gets an answer
                    if not event.accepted.done():
                        event.accepted.set_result(False)
            case Detach(conn=conn, end=end) if conn in self._effects.conns:
                self._effects.conns.remove(conn)
                # A device's normal close ends the session only once every device has left.
                end = self._devices.left(conn) if end else False
                if self._effects.conns:  # the other devices carry on
                    log.info("device_left", device=conn.device, done=end)
                    return
                self._detached_at = self._clock()
                self.detached.set()
                log.info("session_detached", last_seq=self.session.last_seq, ended=end)
                self._effects.tell(lambda observer, now: observer.detached(ended=end, now=now))
                if end:
                    self._receive(Disconnected())
                    await self._flush()
            case CloseSocket(conn=conn, code=code, reason=reason):
                conn.close(code, reason, flush=True)
            case Stop() if self.lease is not None:
                # Handed over as it is: the node the client reconnects to carries it on
                # from its last durable point (a step cut here runs again there).
                self.moved = True
                self.going_away("shutdown", 0.0)
                self._end_socket("service_restart", flush=True)
                await self._journal.release()
            case Stop():
                self._receive(ShuttingDown())
                await self._flush()
                self.going_away("shutdown", 0.0)
                self._end_socket("service_restart", flush=True)
                self._receive(Disconnected())
                await self._flush()
            case TakePosts():
                await self._take_posts()
            case LetGo():
                log.warning("session_lease_lost")
                self._move()
            case _:
                pass

    async def _take_posts(self) -> None:
        """Apply what other nodes posted for the session (tool outcomes and progress), and
        commit it (``Journal.take_posts``)."""
        if await self._journal.take_posts(self._receive):
            await self._flush()

    async def _attach(self, event: Attach) -> None:
        if event.accepted.done():  # the attaching task was cancelled (its socket went)
            return
        conn, last_seq = event.conn, event.last_seq
        if conn.peer_gone and self._effects.conn is not None:
            # A resume its client gave up on (it resumed on another socket meanwhile):
            # taking it would close the client's live socket. Its transport finds the
            # socket ended and lets it go.
            log.info("stale_resume_ignored", last_seq=last_seq)
            event.accepted.set_result(True)
            return
        events, store_error = None, None
        if last_seq is not None:
            try:
                events, store_error = await missed(self._store, self.session, self.lease, last_seq)
            except LeaseLost:
                # Another node took the session over since this resume found it here: the
                # client resumes there (its transport asks the store again), and this
                # node's socket, if it has one, closes with 1013.
                log.warning("session_lease_lost", at="resume")
                self._move()
                event.accepted.set_result(False)
                return
        replaced = self._devices.replaced_by(conn, event.device)
        for old in replaced:
            log.info("session_taken_over", device=old.device)
            old.end(closing("taken_over"))
        declared = self._devices.take(conn, event.device, replaced, acked=last_seq or 0)
        self._detached_at = None
        self._effects.tell(
            lambda observer, now: observer.attached(
                resumed=last_seq is not None, replaced=bool(replaced), now=now
            )
        )
        self.detached.clear()
        if last_seq is not None:
            joined = event.device is not None and event.device.device_id is None
            self._effects.sent(
                replay(
                    conn,
                    self.session,
                    last_seq,
                    events,
                    self._clock(),
                    joined=len(self._effects.conns) if joined else None,
                    declared=self._effects.declared() if self._effects.routed else None,
                )
            )
            if store_error is not None:  # after the snapshot: the client resumed first
                self._journal.store_down(store_error)
        event.accepted.set_result(True)
        if declared is not None:
            update = self._devices.declare(conn, declared, replaced)
            if update is not None:  # the device's functions join the session's
                if self._check_schemas:
                    await self._check_schemas(self.session.declared_schemas(update))
                self._receive(update)
                self._devices.took(update, conn, frozenset(spec.name for spec in declared))
                await self._flush()

    def _model_step(self, effect: CallModel) -> Coroutine[Any, Any, None]:
        """The work of a model step: the agent's model, streamed into this session."""
        other = self._others.get(effect.agent)
        provider = self._provider if other is None else other.provider
        if isinstance(provider, RealtimeProvider):  # its steps go through the session's link
            provider = self._realtime(provider).provider_for(effect.response_id)
        return ModelStep(
            effect,
            provider,
            backlog=self._queue.model_backlog,
            idle=self._idle,
            take_text=self._take_text,
            flush_soon=self._journal.flush_soon,
            feed=self.feed,
            meter=self._meter,
        ).run()
