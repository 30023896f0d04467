"""The answer to one model request: its status checked, its bytes read against timeouts.

``Answer`` times each read: the first byte against the attempt's deadline (set from
``first_byte_timeout`` when the request went out), the next ones against ``stall_timeout``.
Every failure is an ``Attempt`` naming the URL and the cause.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncGenerator, Awaitable
from typing import TYPE_CHECKING, Any

import httpx

from gateway.providers.failure import (
    RETRYABLE_STATUSES,
    Attempt,
    retry_after,
    seconds,
    transport_cause,
    vendor_message,
)
from gateway.providers.sse import SseDecoder, SseEvent

if TYPE_CHECKING:
    from gateway.providers.settings import HttpModel

__all__ = ["Answer", "check", "silent"]

_DRAIN_TIMEOUT = 0.5
"""Seconds to wait for the end of an answer after its finish, so the connection can be
reused; a server slower than that loses the connection, not the step."""
_DRAIN_SIZE = 64 * 1024
_ERROR_BODY_SIZE = 64 * 1024
"""Bytes of an error body read for its message."""


def silent(url: str, first: float | None) -> Attempt:
    """The failure of a server that sent nothing within ``first`` seconds."""
    wait = seconds(first or 0)
    return Attempt(
        f"{url} did not answer within {wait}",
        retry=True,
        reason=f"no answer in {wait}",
        kind="no_answer",
    )


class Answer:
    """The bytes of an answer, each read timed: the first against the attempt's deadline,
    the next ones against ``stall_timeout``."""

    def __init__(
        self, response: httpx.Response, url: str, deadline: float | None, settings: HttpModel
    ) -> None:
        self._chunks = response.aiter_bytes()
        self._url = url
        self._deadline = deadline
        self._first = settings.first_byte_timeout
        self._stall = settings.stall_timeout
        self._flowing = False
        self._head = b""
        """The first bytes, to quote an answer that is not an event stream."""
        self._content_type = response.headers.get("content-type", "").split(";")[0].strip()
        self._status = response.status_code
        self._loop = asyncio.get_running_loop()
        self._watch: asyncio.TimerHandle | None = None
        """The read timer (see ``_timed``)."""
        self._reading: asyncio.Task[Any] | None = None
        self._read_deadline = 0.0
        self._expired = False
        """The timer cancelled the reading task: a timeout."""

    async def read(self, stall: float | None = None) -> bytes | None:
        """The next bytes; None at the end of the answer."""
        loop = self._loop
        if self._flowing:
            pause = self._stall if stall is None else stall
            deadline = None if pause is None else loop.time() + pause
        else:
            deadline = self._deadline
        try:
            chunk = await self._timed(anext(self._chunks, None), deadline)
        except TimeoutError as exc:
            if not self._flowing:
                raise silent(self._url, self._first) from exc
            raise Attempt(
                f"the stream from {self._url} stalled: nothing for {seconds(self._stall or 0)}",
                retry=True,
                reason="the stream stalled",
                kind="stalled",
            ) from exc
        except httpx.TransportError as exc:
            raise Attempt(
                f"the stream from {self._url} broke: {transport_cause(exc)}",
                retry=True,
                reason="the stream broke",
                kind=type(exc).__name__,
            ) from exc
        if chunk:
            self._flowing = True
            if len(self._head) < 1024:
                self._head += chunk[:1024]
        return chunk

    async def _timed(self, read: Awaitable[bytes | None], deadline: float | None) -> bytes | None:
        """``read``, or ``TimeoutError`` at ``deadline``: what ``asyncio.timeout_at`` does,
        with one timer for many reads rather than one per read (a stream is read a chunk at
        a time, often an event at a time). The timer stays armed across reads; when it
        fires during a read past its deadline it cancels the reading task, else it is
        armed again for the deadline of the read under way, if any."""
        if deadline is None:
            return await read
        task = asyncio.current_task()
        assert task is not None
        self._reading, self._read_deadline = task, deadline
        if self._watch is None or self._watch.when() > deadline:
            if self._watch is not None:
                self._watch.cancel()
            self._watch = self._loop.call_at(deadline, self._check_read)
        try:
            return await read
        except asyncio.CancelledError:
            if self._expired:
                self._expired = False
                if task.uncancel() == 0:  # ours alone: a timeout, not a cancellation
                    raise TimeoutError from None
            raise
        finally:
            self._reading = None

    def _check_read(self) -> None:
        self._watch = None
        task = self._reading
        if task is None:
            return  # between reads: the next one arms it
        if self._loop.time() >= self._read_deadline:
            self._expired = True
            task.cancel()
        else:
            self._watch = self._loop.call_at(self._read_deadline, self._check_read)

    def close_timer(self) -> None:
        """Drop the read timer (the answer is done with)."""
        if self._watch is not None:
            self._watch.cancel()
            self._watch = None

    async def read_all(self, limit: int) -> bytes:
        """The answer's bytes up to ``limit`` (what came before a timeout or a break)."""
        data = b""
        try:
            while len(data) < limit and (chunk := await self.read()) is not None:
                data += chunk
        except Attempt:
            pass
        return data[:limit]

    async def events(self) -> AsyncGenerator[SseEvent, None]:
        """The answer's server-sent events."""
        decoder = SseDecoder()
        seen = False
        while (chunk := await self.read()) is not None:
            for event in decoder.feed(chunk):
                seen = True
                yield event
        for event in decoder.close():
            seen = True
            yield event
        if not seen:
            raise self.not_a_stream(self._head)

    async def drain(self) -> None:
        """Read the rest of the answer (after its finish) so the connection is reused."""
        size = 0
        try:
            while size <= _DRAIN_SIZE and (chunk := await self.read(_DRAIN_TIMEOUT)) is not None:
                size += len(chunk)
        except Attempt:
            pass  # the connection is closed instead; the step is whole

    def not_a_stream(self, body: bytes) -> Attempt:
        what = self._content_type or "no content type"
        detail = vendor_message(body) if body else "(empty body)"
        return Attempt(
            f"{self._url} answered HTTP {self._status} with {what}, not an event stream: {detail}",
            retry=False,
            reason="not an event stream",
            kind="not_a_stream",
        )


async def check(response: httpx.Response, body: Answer, url: str, max_retry_after: float) -> None:
    """Raises ``Attempt`` for an error status or an answer that is not an event stream."""
    status = response.status_code
    if status >= 400:
        message = vendor_message(await body.read_all(_ERROR_BODY_SIZE))
        if status in RETRYABLE_STATUSES:
            asked = retry_after(response)
            if asked is not None and asked > max_retry_after:
                raise Attempt(
                    f"HTTP {status} from {url} asked to retry after {seconds(round(asked, 3))}, "
                    f"longer than max_retry_after ({seconds(max_retry_after)}): {message}",
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
    content_type = response.headers.get("content-type", "")
    if "json" in content_type or content_type.startswith("text/html"):
        raise body.not_a_stream(await body.read_all(_ERROR_BODY_SIZE))
