"""One subscriber's view of a conversation's events (or of its answers' audio): a queue
the conversation fills."""

from __future__ import annotations

import asyncio
from typing import Generic, TypeVar

import msgspec

from client_sdk.exceptions import ClientError
from gateway.wire.audio_frame import AnswerAudio
from gateway.wire.v1 import Outbound

__all__ = ["AudioStream", "EventStream", "Subscription"]

T = TypeVar("T")


class _End(msgspec.Struct, frozen=True):
    """Put on the queue when the conversation can go no further."""

    error: ClientError


class Subscription(Generic[T]):
    """What the conversation gets from the moment it was made, in order, once each.

    An async iterator; it raises the conversation's end (``SessionClosed``...) when there
    is nothing more to come. The conversation holds it weakly: a stream the app drops is
    forgotten, whether it was read or not.
    """

    def __init__(self) -> None:
        self._queue: asyncio.Queue[T | _End] = asyncio.Queue()
        self._closed = False

    def put(self, event: T) -> None:
        """Called by the conversation for each event."""
        if not self._closed:
            self._queue.put_nowait(event)

    def end(self, error: ClientError) -> None:
        """Called by the conversation when it ends."""
        self._queue.put_nowait(_End(error))

    def __aiter__(self) -> Subscription[T]:
        return self

    async def __anext__(self) -> T:
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


class EventStream(Subscription[Outbound]):
    """The session's events (``Conversation.events``)."""


class AudioStream(Subscription[AnswerAudio]):
    """The answers' audio, frame by frame (``Conversation.audio``): each an ``AnswerAudio``
    (``response_id``, the ``seq`` of the segment it speaks, ``offset_ms`` in the answer's
    audio, and ``pcm``: PCM16 at the session's ``output_rate``)."""
