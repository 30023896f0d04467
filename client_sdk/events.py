"""One subscriber's view of a conversation's events: a queue the conversation fills."""

from __future__ import annotations

import asyncio

import msgspec

from client_sdk.exceptions import ClientError
from gateway.wire.v1 import Outbound

__all__ = ["EventStream"]


class _End(msgspec.Struct, frozen=True):
    """Put on the queue when the conversation can go no further."""

    error: ClientError


class EventStream:
    """The session's events from the moment it was made, in order, once each.

    An async iterator; it raises the conversation's end (``SessionClosed``...) when there
    is nothing more to come. The conversation holds it weakly: a stream the app drops is
    forgotten, whether it was read or not.
    """

    def __init__(self) -> None:
        self._queue: asyncio.Queue[Outbound | _End] = asyncio.Queue()
        self._closed = False

    def put(self, event: Outbound) -> None:
        """Called by the conversation for each event."""
        if not self._closed:
            self._queue.put_nowait(event)

    def end(self, error: ClientError) -> None:
        """Called by the conversation when it ends."""
        self._queue.put_nowait(_End(error))

    def __aiter__(self) -> EventStream:
        return self

    async def __anext__(self) -> Outbound:
        if self._closed:
            raise StopAsyncIteration
        item = await self._queue.get()
        if isinstance(item, _End):
            self._closed = True
            raise item.error
        return item

    async def aclose(self) -> None:
        """Stop receiving events."""
        self._closed = True
