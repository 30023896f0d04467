"""A session's one queue: everything that happens to it, in order, and which event is next.

Client frames, model events, tool outcomes, deadlines and sockets coming and going all
become events in one queue, which one task (the driver's loop) applies in order. Besides
the core's events, the queue carries the driver's own (``Attach``, ``Detach``...).

Two kinds are bounded apart: client frames (``client_backlog``: a socket's pump waits for
room) and model events (``model_backlog``: a fast model stream waits for room), so that
neither holds the other back. A deadline that has passed goes before waiting events, and a
session that always has one waiting still hands the event loop over now and then.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Iterator

import msgspec

from gateway.core.event import Event, Tick
from gateway.shell.connection import Connection
from gateway.shell.flag import Mailbox
from gateway.shell.inbox import Backlog
from gateway.wire.v1 import ToolSpec

__all__ = [
    "YIELD_EVERY",
    "Attach",
    "CloseSocket",
    "Detach",
    "Device",
    "DriverEvent",
    "FromClient",
    "LetGo",
    "SessionQueue",
    "Stop",
    "TakePosts",
]


YIELD_EVERY = 32
"""A session applies at most this many waiting events in a row before it lets the event
loop run the others (one ``sleep(0)``: a few µs, every 32 events)."""

MODEL_BACKLOG = 256
"""Model events that may wait in a session's queue; a faster model stream waits for room."""


class Attach(msgspec.Struct, frozen=True):
    """Take ``conn`` as the session's socket (``Driver.attach``)."""

    conn: Connection
    last_seq: int | None
    """``None`` for a new session; the client's cursor for a resume."""
    accepted: asyncio.Future[bool]
    """Resolved by the session's loop: ``True`` once it took the socket, ``False`` when the
    session ended first."""
    device: Device | None = None
    """Who the socket is among the session's devices, for ``session.attach`` and a resume
    that names its device; ``None``: the socket takes the whole session (a new session's,
    or a resume without a device, which takes it over from every other socket)."""


class Device(msgspec.Struct, frozen=True):
    """The device a socket attaches as."""

    device_id: str | None
    """``None``: a device joining (``session.attach``): it gets a new id."""
    functions: list[ToolSpec] | None
    """The client functions it declares (``None``: as before, for a device resuming)."""


class Detach(msgspec.Struct, frozen=True):
    """``conn`` is gone (``Driver.detach``)."""

    conn: Connection
    end: bool = False
    """The client closed normally (1000): it is done, the session ends now."""


class Stop(msgspec.Struct, frozen=True):
    """The gateway is stopping: cut the response, close the socket with 1012, end (with a
    durable store: hand the session over as it is, for another node to carry on)."""


class TakePosts(msgspec.Struct, frozen=True):
    """Something was posted to the session's inbox (a tool outcome from another node)."""


class LetGo(msgspec.Struct, frozen=True):
    """The lease is lost (another node took the session): stop driving it."""


class CloseSocket(msgspec.Struct, frozen=True):
    """Close ``conn`` once the events fed before this one have been queued on it."""

    conn: Connection
    code: int
    reason: str


class FromClient(msgspec.Struct, frozen=True):
    """A frame the client sent, counted against the session's client backlog."""

    event: Event
    conn: Connection | None = None
    """The socket it came from (the session's only one when ``None``)."""


DriverEvent = Attach | Detach | Stop | CloseSocket | TakePosts | LetGo
"""What the driver itself is asked to do, in order with the session's events."""

Queued = Event | DriverEvent | FromClient


class SessionQueue:
    """The queue of one session's events.

    Args:
        max_client_events: client frames that may wait in the queue.
        clock: wall-clock seconds, the clock of the core's deadlines.
    """

    __slots__ = (
        "_clock",
        "_loop",
        "_ticked_for",
        "_unyielded",
        "client_backlog",
        "closed",
        "events",
        "model_backlog",
        "parked",
    )

    def __init__(self, *, max_client_events: int, clock: Callable[[], float]) -> None:
        self._clock = clock
        self._loop = asyncio.get_running_loop()
        self.events: Mailbox[Queued] = Mailbox()
        self.client_backlog = Backlog(max_client_events)
        self.model_backlog = Backlog(MODEL_BACKLOG)
        self.parked = False
        """The loop waits for an event on an empty queue (``next``)."""
        self._ticked_for: float | None = None
        """The passed deadline last given a ``Tick`` ahead of waiting events."""
        self._unyielded = 0
        """Events taken in a row without letting the loop run (see ``next``)."""
        self.closed = False
        """Set once the loop has stopped taking events (``drain``): an attach or a client
        frame is refused at once."""

    def attach(
        self, conn: Connection, last_seq: int | None, device: Device | None = None
    ) -> asyncio.Future[bool]:
        """Queue the attach of ``conn`` (see ``Driver.attach_soon``): the future says
        whether the session took it."""
        accepted: asyncio.Future[bool] = self._loop.create_future()
        if self.closed:
            accepted.set_result(False)
        else:
            self.events.put_nowait(Attach(conn, last_seq, accepted, device))
        return accepted

    def put_client(self, event: Event, conn: Connection | None = None) -> None:
        """Queue a frame a client sent, counted against ``max_client_events``."""
        self.client_backlog.add()
        self.events.put_nowait(FromClient(event, conn))

    async def next(self, due: float | None, expiry: float | None) -> Queued | None:
        """The next event to apply, waiting for one if need be.

        Args:
            due: the core's next deadline: a ``Tick`` once it has passed.
            expiry: when the session ends unless an event comes first.

        Returns:
            The event, or ``None`` when the wait reached ``expiry`` or ``due`` first.
        """
        if not self.events.empty():
            # A busy session (a fast stream, a chatty client) always has an event waiting,
            # and taking one from a queue that has one never lets the loop run: hand the
            # loop over now and then, or every other session and timer waits for this one.
            self._unyielded += 1
            if self._unyielded >= YIELD_EVERY:
                self._unyielded = 0
                await asyncio.sleep(0)
            # A deadline that has passed goes first, or it would wait for a quiet moment.
            # Once per deadline: should the core keep a passed one, events still flow.
            if due is not None and due != self._ticked_for and self._clock() >= due:
                self._ticked_for = due
                return Tick()
            return self.events.get_nowait()
        self._unyielded = 0
        deadline = min((d for d in (due, expiry) if d is not None), default=None)
        # Parked: a model's text may be applied meanwhile by its reader (the short path),
        # which moves no deadline (calls come with a step's end, never with its text).
        self.parked = True
        try:
            if deadline is None:
                return await self.events.get()
            async with asyncio.timeout(max(0.0, deadline - self._clock())):
                return await self.events.get()
        except TimeoutError:
            return None
        finally:
            self.parked = False

    def drain(self) -> Iterator[Queued]:
        """Close the queue once its loop has stopped, and empty it: every attach still
        queued is refused (the session ended before taking it); the other events, which
        nobody applies, are given to the caller."""
        self.closed = True
        while not self.events.empty():
            event = self.events.get_nowait()
            if isinstance(event, Attach):
                if not event.accepted.done():
                    event.accepted.set_result(False)
            else:
                yield event
        self.client_backlog.open()
