"""What the HTTP providers share: one pooled client, the request, its retries and timeouts.

The vendors' wire formats differ; their failure modes do not. A subclass says where a
request goes (``upstream``) and how to read the answer's server-sent events (``parse``);
``HttpProvider.stream`` runs attempts of request and parse, and sends the request again
(connection errors, silence, 408/409/429/5xx/529, a stream that drops, stalls or ends early)
as long as the parser has yielded no text and no tool call of the step: nothing of it has
reached the client, so nothing is lost or repeated. Opening events (OpenAI's role chunk,
Anthropic's ``message_start`` or ``ping``, Gemini's empty first chunk) do not count. Before
each wait it yields ``ModelRetrying``, which the client hears as ``response.retrying``.

Timeouts: ``first_byte_timeout`` from sending the request to the first byte of the answer,
then ``stall_timeout`` between bytes. A ``Retry-After`` longer than ``max_retry_after``
fails at once. Each step reads its answer to the end so the connection goes back to the
pool; cancelling the consumer closes the upstream request at once.
"""

from __future__ import annotations

import abc
import asyncio
import contextlib
import json
import os
import random
import re
from collections.abc import AsyncGenerator, AsyncIterator
from typing import Any

import httpx
import msgspec
import structlog

from gateway.core.model import (
    ModelEvent,
    ModelFinish,
    ModelRequest,
    ModelRetrying,
    ModelText,
    ModelToolCall,
)
from gateway.errors import ProviderError
from gateway.providers.answer import Answer, check, silent
from gateway.providers.base import Capabilities, RetryListener
from gateway.providers.failure import Attempt, display_url, seconds, transport_cause
from gateway.providers.settings import HttpModel
from gateway.providers.sse import SseEvent
from gateway.providers.wire import AiohttpTransport

__all__ = [
    "HttpModel",
    "HttpProvider",
    "SseEvent",
    "Upstream",
    "api_key_from_env",
    "json_object",
    "outcome_json",
    "safe_call_id",
    "stream_error",
    "tool_call",
]

log = structlog.get_logger("gateway.providers")


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
        self.transport: httpx.AsyncBaseTransport | None = None
        """Replaces the network (benchmarks and tests may set one)."""
        self.on_retry: RetryListener | None = None
        """Told each retry's reason (the gateway's metrics set it; see ``ReportsRetries``)."""
        self._clients: dict[asyncio.AbstractEventLoop, httpx.AsyncClient] = {}

    @abc.abstractmethod
    def upstream(self, request: ModelRequest) -> Upstream:
        """The HTTP request for one step."""

    @abc.abstractmethod
    def parse(self, events: AsyncIterator[SseEvent]) -> AsyncGenerator[ModelEvent, None]:
        """The model's events in the answer's SSE events: text and tool calls as they come,
        ``ModelFinish`` last. Raises ``ProviderError`` (see ``stream_error``)."""

    async def stream(self, request: ModelRequest) -> AsyncIterator[ModelEvent]:
        """The model's events for ``request`` (see ``gateway.providers.base.Provider``)."""
        upstream = self.upstream(request)
        url = display_url(upstream.url)
        attempt = 0
        while True:
            said = False
            try:
                async for event in self._attempt(upstream, url):
                    said = said or isinstance(event, ModelText | ModelToolCall)
                    yield event
                return
            except Attempt as failed:
                if said or not failed.retry or attempt >= self.settings.max_retries:
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
            yield ModelRetrying(attempt=attempt, delay=delay, reason=retry.reason)
            await asyncio.sleep(delay)

    async def aclose(self) -> None:
        """Close the pooled connections (at shutdown)."""
        loop = asyncio.get_running_loop()
        client = self._clients.pop(loop, None)
        self._close_others(loop)
        if client is not None:
            await client.aclose()

    def _client(self) -> httpx.AsyncClient:
        # One pooled client per event loop (tests run several loops in one process).
        loop = asyncio.get_running_loop()
        client = self._clients.get(loop)
        if client is None:
            self._close_others(loop)
            connect = self.settings.connect_timeout
            # No read timeout here: the attempt times the first byte and each pause itself.
            timeout = httpx.Timeout(connect=connect, read=None, write=connect, pool=connect)
            most = self.settings.max_connections
            limits = httpx.Limits(max_connections=most, max_keepalive_connections=most)
            transport = self.transport or AiohttpTransport(
                max_connections=most, connect_timeout=connect
            )
            client = httpx.AsyncClient(timeout=timeout, limits=limits, transport=transport)
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

    async def _attempt(self, upstream: Upstream, url: str) -> AsyncIterator[ModelEvent]:
        """One try: send the request, yield what ``parse`` makes of the answer, read the
        answer to its end, and only then yield the ``ModelFinish`` (so a consumer that
        stops there leaves no connection behind)."""
        client = self._client()
        loop = asyncio.get_running_loop()
        first = self.settings.first_byte_timeout
        deadline = None if first is None else loop.time() + first
        request = client.build_request(
            "POST", upstream.url, json=upstream.body, headers=upstream.headers
        )
        try:
            async with asyncio.timeout_at(deadline):
                response = await client.send(request, stream=True)
        except TimeoutError as exc:
            raise silent(url, first) from exc
        except httpx.TransportError as exc:
            raise self._unreachable(url, exc) from exc
        finish: ModelFinish | None = None
        body = Answer(response, url, deadline, self.settings)
        try:
            await check(response, body, url, self.settings.max_retry_after)
            async with (
                contextlib.aclosing(body.events()) as events,
                contextlib.aclosing(self.parse(events)) as parsed,
            ):
                try:
                    async for event in parsed:
                        if isinstance(event, ModelFinish):
                            finish = event
                        else:
                            yield event
                except Attempt:
                    raise
                except ProviderError as exc:
                    raise Attempt(
                        f"{url} {exc}",
                        retry=exc.retryable,
                        reason="the stream failed",
                        kind="stream_error",
                    ) from exc
            if finish is None:
                raise Attempt(
                    f"{url} ended the stream before its finish (truncated)",
                    retry=True,
                    reason="the stream ended early",
                    kind="truncated",
                )
            await body.drain()
        finally:
            body.close_timer()
            await response.aclose()
        yield finish

    def _unreachable(self, url: str, exc: httpx.TransportError) -> Attempt:
        if isinstance(exc, httpx.ConnectTimeout):
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


def _backoff(attempt: int) -> float:
    """Seconds before retry number ``attempt`` (1-based) when the server asked nothing:
    exponential (0.5 s, 1 s, 2 s...) with full jitter."""
    return random.uniform(0, 0.5 * 2 ** (attempt - 1))


def json_object(data: str) -> dict[str, Any]:
    """One streamed chunk, which must be a JSON object."""
    try:
        value = msgspec.json.decode(data)  # several times faster, on every chunk
    except msgspec.DecodeError:
        # What msgspec refuses and Python's json takes: half of a UTF-16 surrogate pair
        # escaped (a server cutting an emoji between chunks; gateway.text pairs them
        # again), NaN. Anything else fails here too.
        try:
            value = json.loads(data)
        except json.JSONDecodeError as exc:
            raise stream_error("sent a chunk that is not JSON") from exc
    if not isinstance(value, dict):
        raise stream_error("sent a chunk that is not a JSON object")
    return value


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
