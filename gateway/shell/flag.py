"""Lean stand-ins for ``asyncio.Event`` and ``asyncio.Queue``, for what every session holds.

An idle session holds a dozen events and a queue: each ``asyncio.Event`` allocates a
760-byte deque for its waiters at once, and each ``asyncio.Queue`` three (items, getters,
putters), though nobody waits on most of them most of the time. That was about a fifth of
an idle session's memory (measured with tracemalloc, docs/performance.md). ``Flag`` and
``Mailbox`` keep the same behaviour for the uses here and allocate a waiter list only
while someone waits.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from typing import Generic, TypeVar

__all__ = ["Flag", "Mailbox"]

T = TypeVar("T")


class Flag:
    """``asyncio.Event``'s ``is_set``/``set``/``clear``/``wait``, with no deque until a
    task waits. As with an event, a waiter woken by ``set`` returns even when ``clear``
    comes before it runs."""

    __slots__ = ("_callbacks", "_set", "_waiters")

    def __init__(self, value: bool = False) -> None:
        self._set = value
        self._waiters: list[asyncio.Future[None]] | None = None
        self._callbacks: list[Callable[[], None]] | None = None

    def __repr__(self) -> str:
        return f"<Flag {'set' if self._set else 'unset'}>"

    def is_set(self) -> bool:
        return self._set

    def set(self) -> None:
        if self._set:
            return
        self._set = True
        waiters, self._waiters = self._waiters, None
        if waiters:
            for waiter in waiters:
                if not waiter.done():
                    waiter.set_result(None)
        callbacks, self._callbacks = self._callbacks, None
        if callbacks:
            for callback in callbacks:
                callback()

    def on_set(self, callback: Callable[[], None]) -> None:
        """Call ``callback`` (once) when the flag is next set, at once if it is set: what a
        task that only waits for it would do, without the task."""
        if self._set:
            callback()
        elif self._callbacks is None:
            self._callbacks = [callback]
        else:
            self._callbacks.append(callback)

    def clear(self) -> None:
        self._set = False

    async def wait(self) -> bool:
        if self._set:
            return True
        waiter: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        if self._waiters is None:
            self._waiters = []
        waiters = self._waiters
        waiters.append(waiter)
        try:
            await waiter
        finally:
            if waiter in waiters:  # cancelled or timed out: not woken by ``set``
                waiters.remove(waiter)
        return True


class Mailbox(Generic[T]):
    """An unbounded FIFO with one consumer: ``asyncio.Queue``'s ``put_nowait``,
    ``get_nowait``, ``get`` and ``empty``, in one list (no deque: see the module).

    Taken items go by moving ``_head``; the list is emptied whenever it is all taken (a
    session's queue mostly is) and cut once half of it is taken, so each call is O(1)
    amortized. ``get_nowait`` on an empty mailbox raises ``IndexError``; ``get`` from two
    tasks at once is not supported (the second would replace the first's waiter).
    """

    __slots__ = ("_head", "_items", "_waiter")

    def __init__(self) -> None:
        self._items: list[T] = []
        self._head = 0
        self._waiter: asyncio.Future[None] | None = None

    def __len__(self) -> int:
        return len(self._items) - self._head

    def empty(self) -> bool:
        return self._head == len(self._items)

    def put_nowait(self, item: T) -> None:
        self._items.append(item)
        waiter = self._waiter
        if waiter is not None and not waiter.done():
            waiter.set_result(None)

    def get_nowait(self) -> T:
        items, head = self._items, self._head
        if head == len(items):
            raise IndexError("get_nowait from an empty Mailbox")
        item = items[head]
        head += 1
        if head == len(items):
            items.clear()
            head = 0
        elif head >= _CUT and head * 2 >= len(items):
            del items[:head]
            head = 0
        self._head = head
        return item

    async def get(self) -> T:
        while self._head == len(self._items):
            waiter: asyncio.Future[None] = asyncio.get_running_loop().create_future()
            self._waiter = waiter
            try:
                await waiter
            finally:
                self._waiter = None
        return self.get_nowait()


_CUT = 64
"""A mailbox's taken entries are cut off once there are this many and they are half of it."""
