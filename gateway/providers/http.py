"""What the HTTP providers share: one pooled client, the request, its retries and timeouts.

The vendors' wire formats differ; their failure modes do not. A subclass says where a
request goes (``upstream``) and how to read the answer's server-sent events (``parser``, a
``StreamParser`` made for each attempt); ``HttpProvider`` runs attempts of request and
parse, and sends the request again (connection errors, silence, 408/409/429/5xx/529, a
stream that drops, stalls or ends early) as long as the parser has given no text and no
tool call of the step: nothing of it has reached the client, so nothing is lost or
repeated. Opening events (OpenAI's role chunk, Anthropic's ``message_start`` or ``ping``,
Gemini's empty first chunk) do not count. Before each wait it gives ``ModelRetrying``,
which the client hears as ``response.retrying``.

The model's events are pushed (``Pushes``): the answer's bytes are parsed in the socket's
callback and handed to the step's sink there, a read's worth at once (``Answer``);
``stream`` is the same, through a small buffer, for callers that iterate.

Timeouts: ``first_byte_timeout`` from sending the request to the first byte of the answer,
then ``stall_timeout`` between bytes. A ``Retry-After`` longer than ``max_retry_after``
fails at once. Each step reads its answer to the end so the connection goes back to the
pool; cancelling the step closes the upstream request at once.
"""

from __future__ import annotations

import abc
import asyncio
import contextlib
import json
import os
import random
import re
from collections.abc import AsyncIterator, Callable
from typing import Any, Generic, TypeVar

import msgspec
import structlog

from gateway.core.model import ModelEvent, ModelRequest, ModelRetrying, ModelToolCall
from gateway.errors import ProviderError
from gateway.providers.answer import Answer, StreamParser, check, silent
from gateway.providers.base import Capabilities, ModelSink, RetryListener, Room
from gateway.providers.failure import Attempt, display_url, seconds, transport_cause
from gateway.providers.settings import HttpModel
from gateway.providers.sse import SseEvent
from gateway.providers.wire import ConnectTimeout, HttpClient, HttpError

__all__ = [
    "ChunkDecoder",
    "HttpModel",
    "HttpProvider",
    "SseEvent",
    "StreamParser",
    "Upstream",
    "api_key_from_env",
    "outcome_json",
    "safe_call_id",
    "stream_error",
    "tool_call",
]

log = structlog.get_logger("gateway.providers")

T = TypeVar("T")


class Upstream(msgspec.Struct, frozen=True):
    """Where a step's request goes and what it carries."""

    url: str
    body: dict[str, Any]
    headers: dict[str, str]


def api_key_from_env(name: str | None, default_name: str) -> str | None:
    """The API key from the environment variable the agent names (never from a file)."""
    return os.environ.get(name or default_name) or None


def stream_error(message: str, *, retryable: bool = False) -> ProviderError:
    """A parser's failure: ``message`` follows the URL (``sent a chunk that is not JSON``).

    ``retryable``: the same request may well work again (a truncated stream, an overloaded
    server); it is then sent again if nothing of the step reached the client.
    """
    error = ProviderError(message)
    error.retryable = retryable
    return error


_UNSAFE = re.compile(r"[^a-zA-Z0-9_-]")


def safe_call_id(call_id: str) -> str:
    """A call id any provider accepts (``^[a-zA-Z0-9_-]{1,64}$``)."""
    return _UNSAFE.sub("_", call_id)[:64] or "call"


class HttpProvider(abc.ABC):
    """Base of the HTTP adapters: subclasses build the request and parse the stream."""

    name = "http"

    def __init__(self, settings: HttpModel, *, tools: bool = True) -> None:
        self.settings = settings
        self.capabilities = Capabilities(tools=tools, parallel_tool_calls=tools)
        self.on_retry: RetryListener | None = None
        """Told each retry's reason (the gateway's metrics set it; see ``ReportsRetries``)."""
        self._clients: dict[asyncio.AbstractEventLoop, HttpClient] = {}

    @abc.abstractmethod
    def upstream(self, request: ModelRequest) -> Upstream:
        """The HTTP request for one step."""

    @abc.abstractmethod
    def parser(self) -> StreamParser:
        """A reader of one answer's events: text and tool calls as they come, then the
        ``ModelFinish`` (see ``StreamParser``; ``stream_error`` makes its failures)."""

    def push(self, request: ModelRequest, sink: ModelSink, room: Room) -> asyncio.Task[None]:
        """The model's events for ``request``, given to ``sink`` (see ``Pushes``)."""
        return asyncio.ensure_future(self._push(request, sink, room))

    async def stream(self, request: ModelRequest) -> AsyncIterator[ModelEvent]:
        """The model's events for ``request`` (see ``gateway.providers.base.Provider``)."""
        pipe = _Pipe()
        task = self.push(request, pipe.give, pipe)
        task.add_done_callback(pipe.wake)
        try:
            while True:
                if pipe.events:
                    for event in pipe.take():
                        yield event
                elif task.done():
                    task.result()  # raises the step's failure
                    return
                else:
                    await pipe.wait()
        finally:
            if not task.done():
                task.cancel()
                with contextlib.suppress(asyncio.CancelledError):
                    await task

    async def _push(self, request: ModelRequest, sink: ModelSink, room: Room) -> None:
        upstream = self.upstream(request)
        url = display_url(upstream.url)
        body = _json_bytes(upstream.body)
        attempt = 0
        while True:
            said: list[bool] = [False]
            try:
                await self._attempt(upstream, body, url, sink, room, said)
                return
            except Attempt as failed:
                if said[0] or not failed.retry or attempt >= self.settings.max_retries:
                    raise failed.after(attempt + 1, self.settings.api_key) from failed
                retry = failed
            attempt += 1
            delay = retry.delay if retry.delay is not None else _backoff(attempt)
            log.info(
                "model_retrying",
                url=url,
                attempt=attempt,
                reason=retry.reason,
                delay=round(delay, 3),
            )
            self._report_retry(retry.kind)
            if not sink([ModelRetrying(attempt=attempt, delay=delay, reason=retry.reason)]):
                return
            await asyncio.sleep(delay)

    async def aclose(self) -> None:
        """Close the pooled connections (at shutdown)."""
        loop = asyncio.get_running_loop()
        client = self._clients.pop(loop, None)
        self._close_others(loop)
        if client is not None:
            await client.aclose()

    def _client(self) -> HttpClient:
        # One pooled client per event loop (tests run several loops in one process).
        loop = asyncio.get_running_loop()
        client = self._clients.get(loop)
        if client is None or client.is_closed:
            self._close_others(loop)
            client = HttpClient(
                max_connections=self.settings.max_connections,
                connect_timeout=self.settings.connect_timeout,
            )
            self._clients[loop] = client
        return client

    def _close_others(self, loop: asyncio.AbstractEventLoop) -> None:
        """Close the clients made for other event loops where those still run (a loop in
        another thread); a client of a loop that stopped can only be dropped."""
        for other, client in list(self._clients.items()):
            if other is loop:
                continue
            del self._clients[other]
            if other.is_running():
                with contextlib.suppress(RuntimeError):  # it closed in the meantime
                    asyncio.run_coroutine_threadsafe(client.aclose(), other)

    async def _attempt(
        self,
        upstream: Upstream,
        body: bytes,
        url: str,
        sink: ModelSink,
        room: Room,
        said: list[bool],
    ) -> None:
        """One try: send the request, give the sink what the parser makes of the answer,
        read the answer to its end, and only then give the ``ModelFinish`` (the
        connection is back in the pool by then, for the step that follows)."""
        client = self._client()
        loop = asyncio.get_running_loop()
        first = self.settings.first_byte_timeout
        deadline = None if first is None else loop.time() + first
        try:
            async with asyncio.timeout_at(deadline):
                exchange = await client.post(upstream.url, upstream.headers, body)
        except TimeoutError as exc:
            raise silent(url, first) from exc
        except HttpError as exc:
            raise self._unreachable(url, exc) from exc
        except ValueError as exc:  # a header with a line break (a key read from a file?)
            raise Attempt(
                f"cannot send to {url}: {exc}", retry=False, reason=str(exc), kind="bad_request"
            ) from exc
        answer: Answer | None = None
        try:
            await check(exchange, url, deadline, self.settings)
            answer = Answer(
                exchange, url, deadline, self.settings, parser=self.parser(), sink=sink, room=room
            )
            exchange.read(answer)
            try:
                finish = await answer.done
            finally:
                said[0] = answer.said
        finally:
            if answer is not None:
                answer.stop()
            exchange.close()
        if finish is not None:
            sink([finish])

    def _unreachable(self, url: str, exc: HttpError) -> Attempt:
        if isinstance(exc, ConnectTimeout):
            cause = f"no connection within {seconds(self.settings.connect_timeout)}"
        else:
            cause = transport_cause(exc)
        return Attempt(
            f"cannot reach {url}: {cause}", retry=True, reason=cause, kind=type(exc).__name__
        )

    def _report_retry(self, reason: str) -> None:
        if self.on_retry is not None:
            try:
                self.on_retry(reason)
            except Exception:
                log.exception("retry_listener_failed")


class _Pipe:
    """What ``HttpProvider.stream`` reads: a sink that buffers, and a ``Room`` that is
    full while ``_PIPE_ROOM`` events wait."""

    def __init__(self) -> None:
        self.events: list[ModelEvent] = []
        self.full = False
        self._callbacks: list[Callable[[], None]] = []
        self._waiter: asyncio.Future[None] | None = None

    @property
    def room(self) -> _Pipe:
        return self

    def on_set(self, callback: Callable[[], None]) -> None:
        if self.full:
            self._callbacks.append(callback)
        else:
            callback()

    def give(self, events: list[ModelEvent]) -> bool:
        self.events += events
        self.full = len(self.events) >= _PIPE_ROOM
        self.wake()
        return True

    def take(self) -> list[ModelEvent]:
        events, self.events = self.events, []
        self.full = False
        callbacks, self._callbacks = self._callbacks, []
        for callback in callbacks:
            callback()
        return events

    def wake(self, _: object = None) -> None:
        if self._waiter is not None and not self._waiter.done():
            self._waiter.set_result(None)

    async def wait(self) -> None:
        self._waiter = asyncio.get_running_loop().create_future()
        try:
            await self._waiter
        finally:
            self._waiter = None


_PIPE_ROOM = 256


def _json_bytes(body: dict[str, Any]) -> bytes:
    try:
        return msgspec.json.encode(body)
    except (UnicodeEncodeError, msgspec.EncodeError):
        # Half of a surrogate pair somewhere in the history: escaped, as JSON allows.
        return json.dumps(body).encode()


def _backoff(attempt: int) -> float:
    """Seconds before retry number ``attempt`` (1-based) when the server asked nothing:
    exponential (0.5 s, 1 s, 2 s...) with full jitter."""
    return random.uniform(0, 0.5 * 2 ** (attempt - 1))


class ChunkDecoder(Generic[T]):
    """Decodes a streamed chunk (the bytes of one event's JSON) into ``kind``: a struct of
    only the fields the provider reads, so nothing else of the chunk becomes an object.
    Made once per provider class. A chunk of another shape fails the step clearly."""

    def __init__(self, kind: type[T]) -> None:
        self._kind = kind
        self._decode = msgspec.json.Decoder(kind).decode

    def __call__(self, data: bytes) -> T:
        try:
            return self._decode(data)
        except msgspec.ValidationError as exc:
            raise _wrong_shape(data, exc) from exc
        except msgspec.DecodeError:
            pass
        # What msgspec refuses and Python's json takes: half of a UTF-16 surrogate pair
        # escaped (a server cutting an emoji between chunks; gateway.text pairs them
        # again), NaN. Anything else fails here too.
        try:
            value = json.loads(data.decode("utf-8", "replace"))
        except json.JSONDecodeError as exc:
            raise stream_error("sent a chunk that is not JSON") from exc
        try:
            return msgspec.convert(value, self._kind)
        except msgspec.ValidationError as exc:
            raise _wrong_shape(data, exc) from exc


def _wrong_shape(data: bytes, exc: msgspec.ValidationError) -> ProviderError:
    if not data.lstrip().startswith(b"{"):
        return stream_error("sent a chunk that is not a JSON object")
    return stream_error(f"sent a chunk of an unexpected shape ({exc})")


def outcome_json(output: Any, error: str | None) -> str:
    """A tool outcome as the JSON text models get: the output, or ``{"error": ...}``."""
    return msgspec.json.encode({"error": error} if error is not None else output).decode()


def tool_call(name: str, arguments: str) -> ModelToolCall:
    """A tool call from the model's JSON arguments text; bad JSON fails the call."""
    try:
        args = json.loads(arguments or "{}")
    except json.JSONDecodeError:
        return ModelToolCall(name=name, args={}, args_error="the arguments are not valid JSON")
    if not isinstance(args, dict):
        return ModelToolCall(name=name, args={}, args_error="the arguments are not a JSON object")
    return ModelToolCall(name=name, args=args)
