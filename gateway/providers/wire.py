"""The network under the HTTP providers' httpx client: aiohttp, whose parser is C.

httpx parses responses with h11 (pure Python) through httpcore and anyio: about 110 µs of
CPU per HTTP chunk on the 2-core benchmark machine, and a model server sends each event of
its stream as a chunk of its own. On the gateway's core that is the whole budget of a
delta (docs/performance.md). ``AiohttpTransport`` is an httpx transport that sends the
request with aiohttp (llhttp, in C) and hands over the body as it arrives, every chunk
already buffered in one piece. Everything above it stays httpx: requests, responses,
content decoding, the exceptions the providers catch (aiohttp's are mapped to httpx's,
the OS error kept as the cause), and tests or benchmarks may still set a transport of
their own.

Connections are pooled per transport (one per event loop, as the httpx client is), at most
``max_connections``; a body read to its end gives its connection back, one closed before
(a cancelled step) closes it, so the model server sees the request end at once.
"""

from __future__ import annotations

import ssl
from collections.abc import AsyncIterator

import aiohttp
import certifi
import httpx

__all__ = ["AiohttpTransport"]

_LEFT_TO_AIOHTTP = frozenset({b"host", b"content-length", b"connection", b"transfer-encoding"})
"""Request headers aiohttp writes itself from the request (httpx's would be doubled)."""


class AiohttpTransport(httpx.AsyncBaseTransport):
    """An httpx transport on an aiohttp session (see the module docstring).

    Args:
        max_connections: connections open at once; a request beyond waits for one.
        connect_timeout: seconds to get a connection (from the pool or a new one).
    """

    def __init__(self, *, max_connections: int, connect_timeout: float) -> None:
        self._max_connections = max_connections
        self._timeout = aiohttp.ClientTimeout(
            total=None, connect=connect_timeout, sock_connect=connect_timeout, sock_read=None
        )
        self._session: aiohttp.ClientSession | None = None

    def _open(self) -> aiohttp.ClientSession:
        if self._session is None or self._session.closed:
            # httpx's trust store (certifi), not the system's: the same servers are trusted.
            context = ssl.create_default_context(cafile=certifi.where())
            connector = aiohttp.TCPConnector(limit=self._max_connections, ssl=context)
            self._session = aiohttp.ClientSession(
                connector=connector,
                timeout=self._timeout,
                auto_decompress=False,  # httpx decodes, as it would its own responses
                skip_auto_headers=("User-Agent", "Accept", "Accept-Encoding"),
            )
        return self._session

    async def handle_async_request(self, request: httpx.Request) -> httpx.Response:
        session = self._open()
        headers = [
            (name.decode("latin-1"), value.decode("latin-1"))
            for name, value in request.headers.raw
            if name.lower() not in _LEFT_TO_AIOHTTP
        ]
        body = await request.aread()
        try:
            response = await session.request(
                request.method,
                str(request.url),
                headers=headers,
                data=body or None,
                allow_redirects=False,
            )
        except aiohttp.ConnectionTimeoutError as exc:
            raise httpx.ConnectTimeout(str(exc) or "connect timed out", request=request) from exc
        except aiohttp.ClientConnectorError as exc:
            # The OS error as the cause: the providers name it ("connection refused").
            raise httpx.ConnectError(str(exc), request=request) from exc.os_error
        except aiohttp.ClientError as exc:
            raise httpx.RemoteProtocolError(
                str(exc) or type(exc).__name__, request=request
            ) from exc
        return httpx.Response(
            status_code=response.status,
            headers=list(response.raw_headers),
            stream=_Body(response, request),
            request=request,
            extensions={
                "http_version": b"HTTP/1.1",
                "reason_phrase": (response.reason or "").encode(),
            },
        )

    async def aclose(self) -> None:
        if self._session is not None:
            await self._session.close()
            self._session = None


class _Body(httpx.AsyncByteStream):
    """A response body: aiohttp's chunks as they come; closing it early drops the
    connection (the server sees the request end), closing it read gives it back."""

    def __init__(self, response: aiohttp.ClientResponse, request: httpx.Request) -> None:
        self._response = response
        self._request = request
        self._ended = False

    async def __aiter__(self) -> AsyncIterator[bytes]:
        content = self._response.content
        try:
            while chunk := await content.readany():
                yield chunk
        except aiohttp.ClientPayloadError as exc:
            raise httpx.RemoteProtocolError(str(exc), request=self._request) from exc
        except aiohttp.ClientError as exc:
            raise httpx.ReadError(str(exc) or type(exc).__name__, request=self._request) from exc
        self._ended = True

    async def aclose(self) -> None:
        if self._ended:
            self._response.release()  # read to its end: the connection goes back to the pool
        else:
            self._response.close()
