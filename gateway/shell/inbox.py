"""A socket's inbound frames, read and not yet taken: a bounded queue with an end.

The reader of a socket puts what it reads here and waits while the inbox is full, so it
stops reading the socket: the peer's TCP window closes (back-pressure, not drops). The end
of the stream (and one last item, such as a flood's marker) always fits, so that ending
never waits for room.
"""

from __future__ import annotations

import sys
from typing import Generic, TypeVar

from gateway.shell.flag import Flag

__all__ = ["Backlog", "Inbox"]

T = TypeVar("T")


class Inbox(Generic[T]):
    """At most ``size`` items from one producer to one consumer, then the end.

    Args:
        size: items held at most (``close``'s last item aside).
    """

    def __init__(self, size: int) -> None:
        # A list, not a deque: it holds at most ``size`` frames (256), and an empty
        # deque is 760 bytes (see gateway.flag).
        self._items: list[T] = []
        self._size = size
        self._closed = False
        self._ready = Flag()
        self._room = Flag(True)
        self.peak = 0
        """The most items held at once so far (tests and probes check the bound)."""
        self.stalled = Flag()
        """Set while a ``put`` waits for room: the producer has stopped reading."""

    def __len__(self) -> int:
        return len(self._items)

    @property
    def closed(self) -> bool:
        """The stream has ended: nothing more will be put."""
        return self._closed

    async def put(self, item: T) -> bool:
        """Add ``item`` once there is room.

        Returns:
            ``False`` if the inbox was closed first: ``item`` is dropped, the producer stops.
        """
        while len(self._items) >= self._size and not self._closed:
            self._room.clear()
            self.stalled.set()
            try:
                await self._room.wait()
            finally:
                self.stalled.clear()
        if self._closed:
            return False
        self._items.append(item)
        self.peak = max(self.peak, len(self._items))
        self._ready.set()
        return True

    def close(self, last: T | None = None) -> None:
        """End the stream, after what it holds and then ``last`` (which fits regardless)."""
        if self._closed:
            return
        if last is not None:
            self._items.append(last)
        self._closed = True
        self._ready.set()
        self._room.set()  # a waiting put gives up

    def drop(self) -> None:
        """Forget what is unread and end the stream now."""
        self._items.clear()
        self.close()

    async def get(self) -> T | None:
        """The next item, or ``None`` once the stream has ended (every time after that)."""
        while not self._items:
            if self._closed:
                return None
            self._ready.clear()
            await self._ready.wait()
        item = self._items.pop(0)
        self._room.set()
        return item


class Backlog:
    """How many items of one kind wait in a queue shared with others (a session's events);
    ``room`` is clear while ``limit`` of them wait, so that their producer waits rather than
    grow the queue. The consumer calls ``took`` for each it takes."""

    def __init__(self, limit: int) -> None:
        self._limit = limit
        self.queued = 0
        self.peak = 0
        """The most that waited at once so far (tests check the bound)."""
        self.room = Flag(True)
        self.full = False
        """``room`` is clear (an attribute: checked for every model event)."""

    def add(self) -> None:
        """Count one more waiting item (its producer then waits for ``room``)."""
        self.queued += 1
        self.peak = max(self.peak, self.queued)
        if self.queued >= self._limit:
            self.full = True
            self.room.clear()

    def took(self) -> None:
        """Count one item taken."""
        self.queued -= 1
        if self.queued < self._limit:
            self.full = False
            self.room.set()

    def open(self) -> None:
        """No bound any more: the session ended; whoever waits goes on (to drop its event)."""
        self._limit = sys.maxsize
        self.full = False
        self.room.set()
