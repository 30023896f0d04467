"""The answer to one model request: its status checked, its body read as it arrives.

``Answer`` takes the body from the connection's callbacks (``gateway.providers.wire``):
each read is split into server-sent events, parsed by the provider's ``StreamParser`` and
the model events it makes are handed to the step's sink in one call, in the same callback
as the socket read. No task wakes up per chunk; a burst read at once goes to the client in
one write.

Each read is timed with one timer for the whole answer: the first byte against the
attempt's deadline (set from ``first_byte_timeout`` when the request went out), the next
ones against ``stall_timeout``. While the session has no room for more events the socket
is not read (the server waits on TCP's window), and that is not a stall. Every failure is
an ``Attempt`` naming the URL and the cause.
"""

from __future__ import annotations

import asyncio
from typing import TYPE_CHECKING, Protocol

from gateway.core.model import ModelEvent, ModelFinish, ModelText, ModelToolCall
from gateway.errors import ProviderError
from gateway.providers.base import ModelSink, Room
from gateway.providers.failure import (
    RETRYABLE_STATUSES,
    Attempt,
    retry_after,
    seconds,
    transport_cause,
    vendor_message,
)
from gateway.providers.sse import SseDecoder, SseEvent
from gateway.providers.wire import Exchange, HttpError

if TYPE_CHECKING:
    from gateway.providers.settings import HttpModel

__all__ = ["Answer", "StreamParser", "check", "silent"]

_DRAIN_TIMEOUT = 0.5
"""Seconds to wait for the end of an answer after its finish, so the connection can be
reused; a server slower than that loses the connection, not the step."""
_DRAIN_SIZE = 64 * 1024
_ERROR_BODY_SIZE = 64 * 1024
"""Bytes of an error body read for its message."""
_HEAD_SIZE = 1024
"""The first bytes kept, to quote an answer that is not an event stream."""


class StreamParser(Protocol):
    """A provider's reading of one answer's events (made anew for each attempt)."""

    over: bool
    """The event that ends the answer came (OpenAI's ``[DONE]``): ``end`` follows."""

    def feed(self, events: list[SseEvent]) -> list[ModelEvent]:
        """The model events in ``events``, as far as ``over``. Raises ``ProviderError``."""

    def end(self) -> list[ModelEvent]:
        """The events due at the end (assembled tool calls), ``ModelFinish`` last; raises
        ``ProviderError`` when the answer ended before its finish."""


def silent(url: str, first: float | None) -> Attempt:
    """The failure of a server that sent nothing within ``first`` seconds."""
    wait = seconds(first or 0)
    return Attempt(
        f"{url} did not answer within {wait}",
        retry=True,
        reason=f"no answer in {wait}",
        kind="no_answer",
    )


class _Timed:
    """A body reader's clock: the first byte by ``deadline``, then a byte at least every
    ``stall`` seconds (one timer, moved on only when it fires)."""

    def __init__(self, url: str, deadline: float | None, settings: HttpModel) -> None:
        self._url = url
        self._first = settings.first_byte_timeout
        self._stall = settings.stall_timeout
        self._loop = asyncio.get_running_loop()
        self.done: asyncio.Future[ModelFinish | None] = self._loop.create_future()
        self._flowing = False
        self._paused = False
        self._last = 0.0
        self._timer: asyncio.TimerHandle | None = None
        if deadline is not None:
            self._timer = self._loop.call_at(deadline, self._silent)

    def _tick(self) -> None:
        """A byte came."""
        if self._flowing:
            self._last = self._loop.time()
            return
        self._flowing = True
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None
        if self._stall is not None:
            self._last = self._loop.time()
            self._timer = self._loop.call_at(self._last + self._stall, self._check_stall)

    def _silent(self) -> None:
        self._timer = None
        self._fail(silent(self._url, self._first))

    def _check_stall(self) -> None:
        assert self._stall is not None
        now = self._loop.time()
        if self._paused:  # we do not read: the server is not the one stalling
            self._last = now
        if now - self._last < self._stall:
            self._timer = self._loop.call_at(self._last + self._stall, self._check_stall)
            return
        self._timer = None
        self._fail(
            Attempt(
                f"the stream from {self._url} stalled: nothing for {seconds(self._stall)}",
                retry=True,
                reason="the stream stalled",
                kind="stalled",
            )
        )

    def _fail(self, error: BaseException) -> None:
        self.stop()
        if not self.done.done():
            self.done.set_exception(error)

    def _settle(self, finish: ModelFinish | None) -> None:
        self.stop()
        if not self.done.done():
            self.done.set_result(finish)

    def stop(self) -> None:
        """Drop the timer (the answer is done with)."""
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None

    def broke(self, error: HttpError) -> Attempt:
        return Attempt(
            f"the stream from {self._url} broke: {transport_cause(error)}",
            retry=True,
            reason="the stream broke",
            kind=type(error).__name__,
        )


class _Collect(_Timed):
    """Reads a body up to ``limit`` bytes (an error's): ``done`` is a ``ModelFinish`` of
    nothing; the bytes are in ``body``, what came before a timeout or a break too."""

    def __init__(self, url: str, deadline: float | None, settings: HttpModel, limit: int) -> None:
        super().__init__(url, deadline, settings)
        self._limit = limit
        self.body = b""

    def data(self, chunk: bytes) -> None:
        self._tick()
        self.body += chunk
        if len(self.body) >= self._limit:
            self._settle(None)

    def end(self) -> None:
        self._settle(None)

    def fail(self, error: HttpError) -> None:
        self._settle(None)

    def _fail(self, error: BaseException) -> None:
        self._settle(None)  # a timeout: what came is the message


async def _read_all(
    exchange: Exchange, url: str, deadline: float | None, settings: HttpModel
) -> bytes:
    reader = _Collect(url, deadline, settings, _ERROR_BODY_SIZE)
    exchange.read(reader)
    try:
        await reader.done
    finally:
        reader.stop()
    return reader.body[:_ERROR_BODY_SIZE]


class Answer(_Timed):
    """Reads an event stream into the step's sink (see the module docstring).

    ``done`` ends with the answer's ``ModelFinish`` once the body is whole (or after a
    short drain, so the connection can be reused), with ``None`` when the sink said stop,
    or fails with an ``Attempt`` (or what the sink raised). ``said`` tells whether text or
    a tool call went to the sink: then the request may not be sent again.
    """

    def __init__(
        self,
        exchange: Exchange,
        url: str,
        deadline: float | None,
        settings: HttpModel,
        *,
        parser: StreamParser,
        sink: ModelSink,
        room: Room,
    ) -> None:
        super().__init__(url, deadline, settings)
        self._exchange = exchange
        self._parser = parser
        self._sink = sink
        self._room = room
        self._decoder = SseDecoder()
        self._head = b""
        self._seen = False
        """An event came: the answer is an event stream."""
        self._finish: ModelFinish | None = None
        """Held from the parser's end until the body's (see ``_settle``)."""
        self._drained = -1
        """Bytes read after the finish (-1 before it)."""
        self.said = False

    def data(self, chunk: bytes) -> None:
        if self._drained >= 0:
            self._drained += len(chunk)
            if self._drained > _DRAIN_SIZE:
                self._settle(self._finish)  # the connection is dropped, the step is whole
            return
        self._tick()
        if len(self._head) < _HEAD_SIZE:
            self._head += chunk[:_HEAD_SIZE]
        self._parse(chunk, last=False)

    def end(self) -> None:
        if self._drained < 0:
            self._parse(b"", last=True)
        self._settle(self._finish)  # unless it failed: then it is settled already

    def _parse(self, chunk: bytes, *, last: bool) -> None:
        """Give the sink the model events that ``chunk`` completes (all that are left, at
        the ``last``)."""
        parser = self._parser
        try:
            events = self._decoder.close() if last else self._decoder.feed(chunk)
            given = parser.feed(events) if events else []
            self._seen = self._seen or bool(events)
            if last and not self._seen:
                self._fail(_not_a_stream(self._url, self._exchange, self._head))
                return
            if last or parser.over:
                given += self._ending()
        except ProviderError as exc:
            self._fail(self._stream_failed(exc))
            return
        if given:
            self._give(given)

    def fail(self, error: HttpError) -> None:
        if self._drained >= 0:
            self._settle(self._finish)  # it broke after the finish: the step is whole
        else:
            self._fail(self.broke(error))

    def _ending(self) -> list[ModelEvent]:
        """The parser's last events but the finish, which waits for the body's end; from
        now on the body is only drained."""
        events = self._parser.end()
        last = events[-1] if events else None
        if isinstance(last, ModelFinish):
            self._finish = last
            events.pop()
        self._drained = 0
        if self._timer is not None:
            self._timer.cancel()
        self._timer = self._loop.call_later(_DRAIN_TIMEOUT, self._drain_over)
        return events

    def _drain_over(self) -> None:
        self._timer = None
        self._settle(self._finish)

    def _give(self, events: list[ModelEvent]) -> None:
        if self.done.done():
            return
        if not self.said:
            self.said = any(type(event) in (ModelText, ModelToolCall) for event in events)
        try:
            more = self._sink(events)
        except Exception as exc:  # the session's: the driver reports a crashed model
            self._fail(exc)
            return
        if not more:
            self._settle(None)
            return
        if self._room.full and not self._paused:
            self._paused = True
            self._exchange.pause()
            self._room.room.on_set(self._resume)

    def _resume(self) -> None:
        self._paused = False
        self._exchange.resume()

    def _stream_failed(self, exc: ProviderError) -> Attempt:
        return Attempt(
            f"{self._url} {exc}",
            retry=exc.retryable,
            reason="the stream failed",
            kind="stream_error",
        )


async def check(exchange: Exchange, url: str, deadline: float | None, settings: HttpModel) -> None:
    """Raises ``Attempt`` for an error status or an answer that is not an event stream."""
    status = exchange.status
    if status >= 400:
        message = vendor_message(await _read_all(exchange, url, deadline, settings))
        if status in RETRYABLE_STATUSES:
            asked = retry_after(exchange.headers)
            if asked is not None and asked > settings.max_retry_after:
                raise Attempt(
                    f"HTTP {status} from {url} asked to retry after {seconds(round(asked, 3))}, "
                    f"longer than max_retry_after ({seconds(settings.max_retry_after)}): {message}",
                    retry=False,
                    retryable=True,
                    reason=f"HTTP {status}",
                    kind=f"http_{status}",
                )
            raise Attempt(
                f"HTTP {status} from {url}: {message}",
                retry=True,
                reason=f"HTTP {status}",
                kind=f"http_{status}",
                delay=asked,
            )
        raise Attempt(
            f"HTTP {status} from {url}: {message}",
            retry=False,
            reason=f"HTTP {status}",
            kind=f"http_{status}",
        )
    content_type = exchange.headers.get("content-type", "")
    if "json" in content_type or content_type.startswith("text/html"):
        raise _not_a_stream(url, exchange, await _read_all(exchange, url, deadline, settings))


def _not_a_stream(url: str, exchange: Exchange, body: bytes) -> Attempt:
    what = exchange.headers.get("content-type", "").split(";")[0].strip() or "no content type"
    detail = vendor_message(body) if body else "(empty body)"
    return Attempt(
        f"{url} answered HTTP {exchange.status} with {what}, not an event stream: {detail}",
        retry=False,
        reason="not an event stream",
        kind="not_a_stream",
    )
