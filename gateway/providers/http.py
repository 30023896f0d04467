"""What the HTTP providers share: one pooled client, SSE parsing, retries, timeouts.

The vendors' wire formats differ; their failure modes do not. Before the first
model event, connection errors, 429 (honouring ``Retry-After``) and 5xx are
retried with exponential backoff and jitter. After the first event a broken or
stalled stream is a ``ProviderError``: the session ends the response
``incomplete`` and carries on. Cancelling the consumer closes the upstream
request at once (the connection is dropped, not returned to the pool).
"""

from __future__ import annotations

import abc
import asyncio
import json
import os
import random
import re
import time
from collections.abc import AsyncIterator
from email.utils import parsedate_to_datetime
from typing import Any

import httpx
import msgspec
import structlog

from gateway.errors import ProviderError
from gateway.model import ModelEvent, ModelRequest, ModelToolCall
from gateway.providers.base import Capabilities, RetryListener

__all__ = [
    "HttpModel",
    "HttpProvider",
    "SseEvent",
    "api_key_from_env",
    "json_object",
    "outcome_json",
    "retry_delay",
    "safe_call_id",
    "sse_events",
    "tool_call",
]

log = structlog.get_logger("gateway.providers")

_RETRYABLE = {408, 409, 429, 500, 502, 503, 504, 529}


class HttpModel(msgspec.Struct, frozen=True, kw_only=True):
    """The HTTP settings of a model, from the agent's ``[model]`` table."""

    model: str
    base_url: str
    api_key: str | None = None
    connect_timeout: float = 10.0
    stall_timeout: float = 60.0
    """Seconds without a byte from the model before the stream counts as stalled."""
    max_retries: int = 2
    """Retries before the first event (connection errors, 429, 5xx)."""
    temperature: float | None = None
    max_tokens: int | None = None


def api_key_from_env(name: str | None, default_name: str) -> str | None:
    """The API key from the environment variable the agent names (never from a file)."""
    return os.environ.get(name or default_name) or None


class SseEvent(msgspec.Struct, frozen=True):
    event: str
    data: str


async def sse_events(response: httpx.Response) -> AsyncIterator[SseEvent]:
    """Server-sent events of a streaming response (``data:`` lines joined per event)."""
    event, data = "", list[str]()
    async for line in response.aiter_lines():
        if not line:
            if data:
                yield SseEvent(event or "message", "\n".join(data))
            event, data = "", list[str]()
        elif line.startswith("data:"):
            data.append(line[5:].removeprefix(" "))
        elif line.startswith("event:"):
            event = line[6:].strip()
    if data:
        yield SseEvent(event or "message", "\n".join(data))


def retry_delay(attempt: int, response: httpx.Response | None) -> float:
    """Seconds before retry number ``attempt`` (0-based): ``Retry-After`` if the
    server set one, else exponential backoff (0.5 s, 1 s, 2 s...) with full jitter."""
    if response is not None:
        header = response.headers.get("retry-after")
        if header:
            try:
                return max(0.0, float(header))
            except ValueError:
                try:
                    return max(0.0, parsedate_to_datetime(header).timestamp() - time.time())
                except (TypeError, ValueError):
                    pass
    return random.uniform(0, 0.5 * 2**attempt)


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
    def stream(self, request: ModelRequest) -> AsyncIterator[ModelEvent]:
        """The model's events for ``request`` (see ``gateway.providers.base.Provider``)."""

    async def aclose(self) -> None:
        """Close the pooled connections (at shutdown)."""
        clients, self._clients = self._clients, {}
        loop = asyncio.get_running_loop()
        for client_loop, client in clients.items():
            if client_loop is loop:
                await client.aclose()

    def _client(self) -> httpx.AsyncClient:
        # One pooled client per event loop (tests run several loops in one process).
        loop = asyncio.get_running_loop()
        client = self._clients.get(loop)
        if client is None:
            timeout = httpx.Timeout(
                connect=self.settings.connect_timeout,
                read=self.settings.stall_timeout,
                write=self.settings.connect_timeout,
                pool=self.settings.connect_timeout,
            )
            client = httpx.AsyncClient(timeout=timeout, transport=self.transport)
            self._clients = {loop: client}
        return client

    async def _stream(
        self, url: str, body: dict[str, Any], headers: dict[str, str]
    ) -> AsyncIterator[SseEvent]:
        """POST and yield the response's SSE events, retrying what can be retried."""
        attempt = 0
        while True:
            yielded = False
            try:
                async with self._client().stream(
                    "POST", url, json=body, headers=headers
                ) as response:
                    if response.status_code >= 400:
                        await response.aread()
                        if (
                            response.status_code in _RETRYABLE
                            and attempt < self.settings.max_retries
                        ):
                            delay = retry_delay(attempt, response)
                            log.info(
                                "model_retrying", status=response.status_code, delay=round(delay, 3)
                            )
                            self._report_retry(f"http_{response.status_code}")
                            attempt += 1
                            await asyncio.sleep(delay)
                            continue
                        failure = ProviderError(_http_error(response))
                        failure.retryable = response.status_code in _RETRYABLE
                        raise failure
                    async for event in sse_events(response):
                        yielded = True
                        yield event
                    return
            except httpx.TimeoutException as exc:
                if yielded:
                    raise ProviderError("the model stream stalled") from exc
                error: Exception = exc
            except httpx.TransportError as exc:
                if yielded:
                    raise ProviderError(f"the model stream broke: {type(exc).__name__}") from exc
                error = exc
            if attempt >= self.settings.max_retries:
                raise ProviderError(f"cannot reach the model: {type(error).__name__}") from error
            delay = retry_delay(attempt, None)
            log.info("model_retrying", error=type(error).__name__, delay=round(delay, 3))
            self._report_retry(type(error).__name__)
            attempt += 1
            await asyncio.sleep(delay)

    def _report_retry(self, reason: str) -> None:
        if self.on_retry is not None:
            try:
                self.on_retry(reason)
            except Exception:
                log.exception("retry_listener_failed")


def _http_error(response: httpx.Response) -> str:
    try:
        body = response.json()
        detail = body.get("error", body) if isinstance(body, dict) else body
        if isinstance(detail, dict):
            detail = detail.get("message", detail)
    except (json.JSONDecodeError, ValueError):
        detail = response.text[:200]
    return f"the model answered HTTP {response.status_code}: {detail}"


def json_object(data: str) -> dict[str, Any]:
    """One streamed chunk, which must be a JSON object."""
    try:
        value = json.loads(data)
    except json.JSONDecodeError as exc:
        raise ProviderError("the model sent a chunk that is not JSON") from exc
    if not isinstance(value, dict):
        raise ProviderError("the model sent a chunk that is not a JSON object")
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
